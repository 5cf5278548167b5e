// The overview: how many queues, subscriptions, connections and replicas; the messages they
// hold with a trend; the busiest queues; connections and consumers per replica.

import * as api from './api.js';
import { put, failed, h, num, perReplica, table, total } from './ui.js';
import { points, record, sparkline } from './trend.js';

const SUMMED = 500;
const BUSIEST = 10;

function card(label, value, id) {
  return h('div', { class: 'card', id }, h('div', { class: 'card-value' }, value),
    h('div', { class: 'card-label' }, label));
}

function summary(queues, subscriptions, connections) {
  const rows = [...queues.items, ...subscriptions.items];
  const consumers = {};
  for (const row of rows) {
    for (const [replica, n] of Object.entries(row.consumers || {})) {
      consumers[replica] = (consumers[replica] || 0) + n;
    }
  }
  const links = {};
  for (const c of connections) links[c.replica] = (links[c.replica] || 0) + 1;
  const replicas = [...new Set([...Object.keys(consumers), ...Object.keys(links)])].sort();
  return {
    backlog: rows.reduce((a, r) => a + r.backlog, 0),
    inFlight: rows.reduce((a, r) => a + r.in_flight, 0),
    consumers, links, replicas,
  };
}

export async function render(main) {
  const body = h('div', { id: 'overview' });
  main.append(h('div', { class: 'toolbar' }, h('h1', {}, 'Overview')), body);

  async function refresh() {
    // the largest backlogs first: their sum is the whole when fewer than SUMMED hold messages
    const [queues, subscriptions, connections] = await Promise.all([
      api.get('/queues', { limit: SUMMED, sort: 'backlog' }),
      api.get('/subscriptions', { limit: SUMMED, sort: 'backlog' }),
      api.get('/connections').catch(() => []),  // needs browse on every address
    ]);
    const s = summary(queues, subscriptions, connections);
    const trend = record('overview:backlog', s.backlog);
    const more = (page) => page.total > SUMMED && page.items[page.items.length - 1].backlog > 0;
    const partial = more(queues) || more(subscriptions);
    const busiest = queues.items.slice(0, BUSIEST).filter((q) => q.backlog > 0);
    put(body,
      h('div', { class: 'cards' },
        card('Queues', num(queues.total), 'card-queues'),
        card('Subscriptions', num(subscriptions.total), 'card-subscriptions'),
        card('Connections', num(connections.length), 'card-connections'),
        card('Replicas', num(s.replicas.length), 'card-replicas'),
        card('Messages (backlog)', `${partial ? '≥ ' : ''}${num(s.backlog)}`, 'card-backlog'),
        card('In flight', `${partial ? '≥ ' : ''}${num(s.inFlight)}`, 'card-in-flight')),
      partial ? h('p', { class: 'muted' }, `More than ${num(SUMMED)} queues or subscriptions `
        + `hold messages: the totals are those of the ${num(SUMMED)} largest backlogs.`) : null,
      h('section', { class: 'panel' }, h('h2', {}, 'Backlog'),
        h('div', { class: 'chart' }, sparkline(points('overview:backlog'), 720, 90)),
        h('p', { class: 'muted' }, `${trend.length} samples, one every refresh (5 s)`)),
      h('div', { class: 'columns' },
        h('section', { class: 'panel' }, h('h2', {}, 'Busiest queues'),
          table(['Queue', 'Backlog', 'Consumers per replica'], busiest.map((q) => h('tr', {},
            h('td', { class: 'name' }, h('a', { href: `#/queue/${api.path(q.name)}` }, q.name)),
            h('td', { class: 'n' }, num(q.backlog)), h('td', {}, perReplica(q.consumers)))),
          { id: 'busiest-table' })),
        h('section', { class: 'panel' }, h('h2', {}, 'Replicas'),
          table(['Replica', 'Connections', 'Consumers'], s.replicas.map((r) => h('tr', {},
            h('td', {}, r), h('td', { class: 'n' }, num(s.links[r] || 0)),
            h('td', { class: 'n' }, num(s.consumers[r] || 0))))),
          h('p', { class: 'muted' }, `${num(total(s.consumers))} consumers in all`))),
    );
  }
  await refresh();
  return { refresh: () => refresh().catch(failed) };
}
