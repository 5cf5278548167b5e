// One queue or subscription: its figures per replica, its backlog trend, pause and resume,
// purge (after a confirmation), delete (a subscription) and its message browser.

import * as api from './api.js';
import { put, age, confirm, failed, field, h, notice, num, perReplica, rate } from './ui.js';
import { points, record, sparkline } from './trend.js';
import { trendKey } from './lists.js';
import { browser } from './browser.js';

export async function render(main, kind, name) {
  const base = kind === 'queue' ? `/queues/${api.path(name)}` : `/subscriptions/${api.path(name)}`;
  const list = kind === 'queue' ? 'queues' : 'subscriptions';
  const key = trendKey(kind, name);
  const title = h('h1', {}, `${kind === 'queue' ? 'Queue' : 'Subscription'} `,
    h('span', { class: 'mono', id: 'entity-name' }, name));
  const stateBadge = h('span', { class: 'state' });
  const pause = h('button', { type: 'button', id: 'pause' });
  const figures = h('div', { class: 'fields', id: 'figures' });
  const chart = h('div', { class: 'chart', id: 'trend' });
  let row = null;

  async function refresh() {
    row = await api.get(base);
    record(key, row.backlog);
    stateBadge.className = `state ${row.paused ? 'paused' : 'running'}`;
    stateBadge.textContent = row.paused ? 'paused' : 'running';
    pause.textContent = row.paused ? 'Resume delivery' : 'Pause delivery';
    const rates = row.rates || {};
    put(figures,
      field('Ready', h('span', { id: 'ready' }, num(row.ready))),
      field('In flight', num(row.in_flight)),
      field('Backlog', h('span', { id: 'backlog' }, num(row.backlog))),
      field('Oldest message', age(row.oldest_age_seconds)),
      field('Consumers per replica', perReplica(row.consumers)),
      field('Delivered per replica', perReplica(row.delivered)),
      field('Enqueued', rate(rates.enqueued_per_second)),
      field('Delivered', rate(rates.delivered_per_second)),
      field('Acknowledged', rate(rates.acknowledged_per_second)),
      kind === 'subscription' ? field('Topic', row.topic) : null,
      kind === 'subscription' ? field('Kind', row.kind) : null,
      kind === 'subscription' && row.selector ? field('Selector', row.selector) : null,
    );
    put(chart, sparkline(points(key), 720, 70));
  }

  async function togglePause() {
    const paused = !row.paused;
    const done = await api.post(`${base}/${paused ? 'pause' : 'resume'}`);
    const waiting = done.unconfirmed || [];
    const verb = paused ? 'paused' : 'resumed';
    notice(waiting.length
      ? `${name}: delivery ${verb}; not yet applied by ${waiting.join(', ')} (within 5 s)`
      : `${name}: delivery ${verb} on every replica`, waiting.length ? 'warn' : 'info');
    await refresh();
  }

  async function purge() {
    const sure = await confirm(`Purge ${name}`, `Delete all ${num(row.backlog)} messages of `
      + `${name}? Messages out at a consumer stay until settled. This cannot be undone.`, 'Purge');
    if (!sure) return;
    const done = await api.post(`${base}/purge`);
    notice(`Purged ${num(done.purged)} message(s) of ${name}`
      + (done.in_flight ? `; ${num(done.in_flight)} in flight left` : ''));
    await refresh();
    await view.load();
  }

  async function remove() {
    const sure = await confirm(`Delete ${name}`,
      `Delete the subscription ${name} and its ${num(row.backlog)} messages?`, 'Delete');
    if (!sure) return;
    await api.del(base);
    window.addEventListener('hashchange', () => notice(`Deleted subscription ${name}`),
      { once: true });  // after the shell's own listener has drawn the list
    location.hash = '#/subscriptions';
  }

  const act = (fn) => () => fn().catch(failed);
  pause.addEventListener('click', act(togglePause));
  const view = browser(kind, name, refresh);
  main.append(
    h('div', { class: 'crumbs' }, h('a', { href: `#/${list}` }, kind === 'queue' ? 'Queues'
      : 'Subscriptions'), ' › ', name),
    h('div', { class: 'toolbar' }, title, stateBadge, h('span', { class: 'spacer' }), pause,
      h('button', { type: 'button', id: 'purge', class: 'danger', onclick: act(purge) }, 'Purge'),
      kind === 'subscription' ? h('button', { type: 'button', id: 'delete-subscription',
        class: 'danger', onclick: act(remove) }, 'Delete') : null),
    h('div', { class: 'columns' }, h('section', { class: 'panel' }, h('h2', {}, 'Details'),
      figures), h('section', { class: 'panel' }, h('h2', {}, 'Backlog trend'), chart,
      h('p', { class: 'muted' }, 'Sampled at each refresh (5 s) while this page is open.'))),
    view.element,
  );
  await refresh();
  await view.load();
  return { refresh: () => refresh().catch(failed) };
}
