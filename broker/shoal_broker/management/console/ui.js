// Small DOM helpers shared by the pages: elements, number and age formats, the notice bar,
// the confirmation dialog, a pager and a sortable-free table.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, v);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function num(n) {
  return n === undefined || n === null ? '–' : Number(n).toLocaleString('en-US');
}

export function rate(r) {
  return r ? `${Number(r).toFixed(r < 10 ? 1 : 0)}/s` : '0/s';
}

export function age(seconds) {
  if (seconds === null || seconds === undefined) return '–';
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

export function time(ms) {
  return ms ? new Date(ms).toISOString().replace('T', ' ').replace('Z', '') : '–';
}

// consumers (or any count) per replica: one small badge each, "none" when empty
export function perReplica(counts) {
  const entries = Object.entries(counts || {}).filter(([, n]) => n > 0);
  if (!entries.length) return h('span', { class: 'muted' }, '0');
  return h('span', { class: 'replicas' }, entries.map(([replica, n]) =>
    h('span', { class: 'badge', title: `replica ${replica}` }, `${replica}: ${n}`)));
}

export function total(counts) {
  return Object.values(counts || {}).reduce((a, b) => a + b, 0);
}

let noticeTimer = null;
export function notice(text, kind = 'info') {
  const el = document.getElementById('notice');
  el.textContent = text;
  el.className = `notice ${kind}`;
  el.hidden = false;
  clearTimeout(noticeTimer);
  if (kind !== 'error') noticeTimer = setTimeout(() => { el.hidden = true; }, 8000);
}

export function clearNotice() {
  document.getElementById('notice').hidden = true;
}

// The confirmation step of a destructive operation: resolves true only on "Confirm".
export function confirm(title, text, okLabel = 'Confirm') {
  const dialog = document.getElementById('confirm');
  document.getElementById('confirm-title').textContent = title;
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = okLabel;
  dialog.returnValue = '';
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true });
    dialog.showModal();
  });
}

// "1–50 of 10,000" with first/previous/next/last buttons; onPage(offset) turns the page.
export function pager(offset, limit, count, onPage, id = 'pager') {
  const last = Math.max(0, Math.floor((count - 1) / limit) * limit);
  const shown = count ? `${num(offset + 1)}–${num(Math.min(offset + limit, count))} of ${num(count)}`
    : 'none';
  const button = (label, to, disabled, name) => h('button', {
    type: 'button', class: 'page', disabled, 'data-page': name, onclick: () => onPage(to),
  }, label);
  return h('div', { class: 'pager', id },
    button('« First', 0, offset <= 0, 'first'),
    button('‹ Previous', Math.max(0, offset - limit), offset <= 0, 'previous'),
    h('span', { class: 'range' }, shown),
    button('Next ›', offset + limit, offset + limit >= count, 'next'),
    button('Last »', last, offset >= last, 'last'));
}

export function table(headers, rows, attrs = {}) {
  return h('table', { class: 'grid', ...attrs },
    h('thead', {}, h('tr', {}, headers.map((x) => h('th', {}, x)))),
    h('tbody', {}, rows.length ? rows : h('tr', {}, h('td', {
      colspan: String(headers.length), class: 'empty' }, 'Nothing to show'))));
}

export function field(label, value) {
  return h('div', { class: 'field' }, h('span', { class: 'label' }, label),
    h('span', { class: 'value' }, value));
}

// a failed call of any page: the shell decides (log-in form on 401, the notice bar otherwise)
export function failed(error) {
  window.dispatchEvent(new CustomEvent('shoal:failed', { detail: error }));
}

// replaces the children of el by the given ones, leaving out null, undefined and false
export function put(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}
