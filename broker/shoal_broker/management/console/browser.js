// The message browser of one queue or subscription: pages of messages read without consuming
// them, filtered by a JMS selector, each row opening to its header, properties, application
// properties, annotations and body preview. On a queue, the messages ticked (or every one the
// selector matches) can be retried to their original address, moved or deleted.

import * as api from './api.js';
import { put, confirm, failed, h, notice, num, table, time } from './ui.js';

const SIZES = [20, 50, 200];
const ORIGINAL = 'x-opt-shoal-original-address';

function describe(transfer) {
  const parts = [`${num(transfer.moved)} moved`];
  for (const k of ['in_flight', 'skipped', 'duplicated', 'denied']) {
    if (transfer[k]) parts.push(`${num(transfer[k])} ${k.replace('_', ' ')}`);
  }
  const targets = Object.entries(transfer.targets || {}).map(([t, n]) => `${t}: ${n}`);
  return parts.join(', ') + (targets.length ? ` (${targets.join(', ')})` : '');
}

function summary(props) {
  const entries = Object.entries(props || {});
  if (!entries.length) return h('span', { class: 'muted' }, '–');
  return entries.slice(0, 4).map(([k, v]) => h('span', { class: 'kv' }, `${k}=${JSON.stringify(v)}`));
}

function bodyText(body) {
  if (!body) return '';
  if (body.text !== undefined) return body.text;
  if (body.base64 !== undefined) return `(binary, ${body.size} bytes)`;
  return `(${body.kind})`;
}

function detail(m, columns) {
  const shown = { ...m };
  return h('tr', { class: 'detail' }, h('td', { colspan: String(columns) },
    h('pre', {}, JSON.stringify(shown, null, 2))));
}

export function browser(kind, name, changed) {
  const base = kind === 'queue' ? `/queues/${api.path(name)}` : `/subscriptions/${api.path(name)}`;
  const selector = h('input', { id: 'selector', type: 'text', class: 'wide',
    placeholder: "JMS selector, e.g. JMSPriority > 4 AND region = 'eu'", 'aria-label': 'selector' });
  const size = h('select', { id: 'browse-size', 'aria-label': 'messages per page' },
    SIZES.map((n) => h('option', { value: String(n), selected: n === 50 }, `${n} a page`)));
  const target = h('input', { id: 'move-target', type: 'text', placeholder: 'target address',
    'aria-label': 'move target' });
  const list = h('div', { id: 'messages' });
  const cursors = [null];  // the cursor of each page shown so far: previous pages come back
  let page = 0;
  let next = null;
  let messages = [];

  const ticked = () => [...list.querySelectorAll('input.pick:checked')].map((c) => c.value);

  async function load() {
    const found = await api.get(`${base}/messages`, {
      limit: size.value, selector: selector.value.trim(), cursor: cursors[page],
    });
    messages = found.messages;
    next = found.next;
    draw();
  }

  function draw() {
    const headers = [h('input', { type: 'checkbox', id: 'pick-all', 'aria-label': 'tick all',
      onchange: (e) => list.querySelectorAll('input.pick').forEach((c) => {
        c.checked = e.target.checked;
      }) }), 'Id', 'Enqueued', 'State', 'Deliveries', 'Subject', 'Application properties',
    'Original address', 'Body'];
    const rows = [];
    for (const m of messages) {
      const row = h('tr', { class: 'message', 'data-id': m.id },
        h('td', {}, h('input', { type: 'checkbox', class: 'pick', value: m.id,
          'aria-label': `tick ${m.id}` })),
        h('td', { class: 'mono' }, h('a', { href: '#', class: 'open', onclick: (e) => {
          e.preventDefault();
          if (row.nextSibling && row.nextSibling.classList.contains('detail')) row.nextSibling.remove();
          else row.after(detail(m, headers.length));
        } }, m.id)),
        h('td', {}, time(m.enqueued_ms)), h('td', {}, m.state),
        h('td', { class: 'n' }, m.header ? m.header.delivery_count : '–'),
        h('td', {}, (m.properties && m.properties.subject) || ''),
        h('td', {}, summary(m.application_properties)),
        h('td', {}, (m.annotations && m.annotations[ORIGINAL]) || ''),
        h('td', { class: 'body' }, m.error || bodyText(m.body)));
      rows.push(row);
    }
    put(list,
      h('div', { class: 'pager' },
        h('button', { type: 'button', id: 'browse-first', disabled: page === 0,
          onclick: () => turn(0) }, '« First'),
        h('button', { type: 'button', id: 'browse-previous', disabled: page === 0,
          onclick: () => turn(page - 1) }, '‹ Previous'),
        h('span', { class: 'range', id: 'browse-range' },
          `Page ${page + 1}: ${messages.length} message${messages.length === 1 ? '' : 's'}`),
        h('button', { type: 'button', id: 'browse-next', disabled: next === null,
          onclick: () => turn(page + 1) }, 'Next ›')),
      table(headers, rows, { id: 'messages-table' }));
  }

  function turn(to) {
    if (to > page) cursors[to] = next;
    page = to;
    cursors.length = page + 1;
    load().catch(failed);
  }

  function restart() {
    cursors.length = 1;
    page = 0;
    return load();
  }

  // ids ticked, else the selector's matches, else everything: what the API's body says
  function chosen() {
    const ids = ticked();
    if (ids.length) return { body: { ids }, what: `${ids.length} ticked message(s)` };
    const s = selector.value.trim();
    if (s) return { body: { selector: s }, what: `every message matching ${s}` };
    return { body: {}, what: 'every message' };
  }

  async function retry() {
    const { body, what } = chosen();
    if (!await confirm('Retry messages', `Send ${what} of ${name} back to the address `
      + 'each was dead-lettered or expired from?', 'Retry')) return;
    notice(`Retry: ${describe(await api.post(`${base}/retry`, body))}`);
    await changed();
    await restart();
  }

  async function move() {
    const to = target.value.trim();
    if (!to) {
      notice('Name the address to move the messages to.', 'error');
      target.focus();
      return;
    }
    const { body, what } = chosen();
    if (!await confirm('Move messages', `Move ${what} of ${name} to ${to}?`, 'Move')) return;
    notice(`Move: ${describe(await api.post(`${base}/move`, { ...body, target: to }))}`);
    await changed();
    await restart();
  }

  async function remove() {
    const ids = ticked();
    if (!ids.length) {
      notice('Tick the messages to delete.', 'error');
      return;
    }
    if (!await confirm('Delete messages', `Delete ${ids.length} message(s) of ${name}? `
      + 'They are gone for good.', 'Delete')) return;
    for (const id of ids) await api.del(`${base}/messages/${api.path(id)}`);
    notice(`Deleted ${ids.length} message(s)`);
    await changed();
    await restart();
  }

  const act = (fn) => () => fn().catch(failed);
  const writes = kind === 'queue' ? h('div', { class: 'toolbar actions' },
    h('button', { type: 'button', id: 'retry', onclick: act(retry),
      title: 'ticked messages, else those the selector matches, else all' }, 'Retry to original address'),
    target,
    h('button', { type: 'button', id: 'move', onclick: act(move) }, 'Move'),
    h('button', { type: 'button', id: 'delete', class: 'danger', onclick: act(remove) },
      'Delete ticked')) : null;
  const form = h('form', { class: 'toolbar', id: 'browse-form', onsubmit: (e) => {
    e.preventDefault();
    restart().catch(failed);
  } }, selector, size, h('button', { type: 'submit', id: 'browse', class: 'primary' }, 'Browse'));
  const element = h('section', { class: 'panel', id: 'browser' },
    h('h2', {}, 'Messages'),
    h('p', { class: 'muted' }, kind === 'queue' ? 'Read without consuming. Retry, move and '
      + 'delete act on the ticked messages, else on those the selector matches, else on all.'
      : 'Read without consuming.'),
    form, writes, list);
  return { element, load: restart };
}
