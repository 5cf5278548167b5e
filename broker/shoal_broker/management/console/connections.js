// Client connections of every replica, each with a Close button (amqp:connection:forced).

import * as api from './api.js';
import { put, confirm, failed, h, notice, table } from './ui.js';

const SHOWN = ['replica', 'id', 'peer', 'user', 'container_id', 'client_id', 'links'];

export async function render(main) {
  const body = h('div', { id: 'connections' });
  main.append(h('div', { class: 'toolbar' }, h('h1', {}, 'Connections')), body);

  async function close(c) {
    const sure = await confirm('Close connection',
      `Close connection ${c.id} on replica ${c.replica}? Its client is told amqp:connection:forced.`,
      'Close connection');
    if (!sure) return;
    await api.del(`/connections/${api.path(c.replica)}/${api.path(String(c.id))}`);
    notice(`Closing connection ${c.id} on ${c.replica}`);
    await refresh();
  }

  async function refresh() {
    const found = await api.get('/connections');
    const keys = [...new Set(found.flatMap((c) => Object.keys(c)))];
    const columns = [...SHOWN.filter((k) => keys.includes(k)),
      ...keys.filter((k) => !SHOWN.includes(k)).sort()];
    const text = (v) => (v !== null && typeof v === 'object' ? JSON.stringify(v) : String(v ?? ''));
    const headers = [...columns.map((k) => k.replace('_', ' ')), ''];
    put(body, table(headers, found.map((c) => h('tr', { 'data-container': c.container_id },
      columns.map((k) => h('td', {}, text(c[k]))),
      h('td', {}, h('button', { type: 'button', class: 'small',
        onclick: () => close(c).catch(failed) }, 'Close')))), { id: 'connections-table' }));
  }
  await refresh();
  return { refresh: () => refresh().catch(failed) };
}
