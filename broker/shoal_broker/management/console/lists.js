// The queue and subscription lists: paged and searched by the API (offset, limit, search), so
// they stay quick at ten thousand queues; a backlog trend per row, sampled at each refresh.

import * as api from './api.js';
import { put, age, failed, h, num, pager, perReplica, rate, table } from './ui.js';
import { points, record, sparkline } from './trend.js';

export const PAGE_SIZES = [20, 50, 100, 500];

const COLUMNS = {
  queues: ['Name', 'State', 'Ready', 'In flight', 'Backlog', 'Backlog trend', 'Oldest',
    'Consumers per replica', 'In rate', 'Out rate'],
  subscriptions: ['Subscription', 'Topic', 'Kind', 'State', 'Ready', 'In flight', 'Backlog',
    'Backlog trend', 'Oldest', 'Consumers per replica', 'Out rate'],
};

export function trendKey(kind, name) {
  return `${kind}:${name}`;
}

function state(row) {
  return h('span', { class: row.paused ? 'state paused' : 'state running' },
    row.paused ? 'paused' : 'running');
}

function queueRow(q) {
  const key = trendKey('queue', q.name);
  record(key, q.backlog);
  return h('tr', { 'data-name': q.name },
    h('td', { class: 'name' }, h('a', { href: `#/queue/${api.path(q.name)}` }, q.name)),
    h('td', {}, state(q)), h('td', { class: 'n' }, num(q.ready)),
    h('td', { class: 'n' }, num(q.in_flight)), h('td', { class: 'n' }, num(q.backlog)),
    h('td', {}, sparkline(points(key))), h('td', { class: 'n' }, age(q.oldest_age_seconds)),
    h('td', {}, perReplica(q.consumers)),
    h('td', { class: 'n' }, rate(q.rates.enqueued_per_second)),
    h('td', { class: 'n' }, rate(q.rates.delivered_per_second)));
}

function subscriptionRow(s) {
  const key = trendKey('subscription', s.id);
  record(key, s.backlog);
  return h('tr', { 'data-name': s.id },
    h('td', { class: 'name' }, h('a', { href: `#/subscription/${api.path(s.id)}` }, s.id)),
    h('td', {}, s.topic), h('td', {}, s.kind), h('td', {}, state(s)),
    h('td', { class: 'n' }, num(s.ready)), h('td', { class: 'n' }, num(s.in_flight)),
    h('td', { class: 'n' }, num(s.backlog)), h('td', {}, sparkline(points(key))),
    h('td', { class: 'n' }, age(s.oldest_age_seconds)), h('td', {}, perReplica(s.consumers)),
    h('td', { class: 'n' }, rate(s.rates.delivered_per_second)));
}

function go(kind, search, offset, limit, sort) {
  const query = new URLSearchParams();
  if (search) query.set('search', search);
  if (offset) query.set('offset', offset);
  if (limit !== 50) query.set('limit', limit);
  if (sort !== 'name') query.set('sort', sort);
  location.hash = `#/${kind}${query.toString() ? `?${query}` : ''}`;
}

export async function render(main, kind, query) {
  const search = query.search || '';
  const limit = PAGE_SIZES.includes(Number(query.limit)) ? Number(query.limit) : 50;
  const offset = Math.max(0, Number.parseInt(query.offset || '0', 10) || 0);
  const sort = query.sort === 'backlog' ? 'backlog' : 'name';
  const box = h('input', {
    id: 'search', type: 'search', value: search, placeholder: 'Filter by name (contains)',
    'aria-label': 'search',
  });
  let typing = null;
  box.addEventListener('input', () => {
    clearTimeout(typing);
    typing = setTimeout(() => go(kind, box.value, 0, limit, sort), 400);
  });
  const size = h('select', { id: 'page-size', 'aria-label': 'page size',
    onchange: () => go(kind, box.value, 0, Number(size.value), sort) },
  PAGE_SIZES.map((n) => h('option', { value: String(n), selected: n === limit }, `${n} a page`)));
  const order = h('select', { id: 'sort', 'aria-label': 'order',
    onchange: () => go(kind, box.value, 0, limit, order.value) },
  h('option', { value: 'name', selected: sort === 'name' }, 'By name'),
  h('option', { value: 'backlog', selected: sort === 'backlog' }, 'Largest backlog first'));
  const body = h('div', { id: 'listing' });
  const title = kind === 'queues' ? 'Queues' : 'Subscriptions';
  main.append(h('div', { class: 'toolbar' }, h('h1', {}, title), h('span', { class: 'spacer' }),
    box, order, size), body);

  async function refresh() {
    const page = await api.get(`/${kind}`, { offset, limit, search, sort });
    const rows = page.items.map(kind === 'queues' ? queueRow : subscriptionRow);
    const turn = (to) => go(kind, box.value, to, limit, sort);
    put(body,
      pager(offset, limit, page.total, turn, 'pager'),
      table(COLUMNS[kind], rows, { id: `${kind}-table` }),
      pager(offset, limit, page.total, turn, 'pager-bottom'),
    );
    body.dataset.total = String(page.total);
  }
  await refresh();
  if (search) {
    box.focus();
    box.setSelectionRange(search.length, search.length);
  }
  return { refresh: () => refresh().catch(failed) };
}
