#!/usr/bin/env node
/*
 * JMS subscription scenarios with rhea (an AMQP 1.0 implementation independent of proton),
 * built by hand from what Qpid JMS puts on the wire (jms-amqp-facts §1.2, §1.5, §2, §3.2, §4).
 * Usage:
 *
 *   node jms.js '{"timeout_ms": 20000, "steps": [{"op": "connect", "conn": "a", "port": 5672}]}'
 *
 * Runs the steps in order, each bounded by its own "timeout_ms" (default 5000) and all of them by
 * the overall "timeout_ms" (default 20000). Prints exactly one JSON line on stdout:
 * {"ok": true, "steps": [one result per step]}, or {"ok": false, "error": "...", "step": index,
 * "steps": [results so far]} on an error, a step timing out or anything unexpected (an error
 * event nobody asked for), and then exits non-zero.
 *
 * Steps (every result repeats "op"):
 *   connect      {conn, port, host?, container_id?, desired?, retry_ms?}: an Open as Qpid JMS
 *                sends it: container-id = the ClientID (default a generated "ID:<uuid>:1"),
 *                desired capabilities [sole-connection-for-container, DELAYED_DELIVERY,
 *                ANONYMOUS-RELAY, SHARED-SUBS] unless "desired" is given. Waits for the broker's
 *                Open; when that carries amqp:connection-establishment-failed, also for its
 *                Close. Result: {opened, refused, attempts, events}, events being the frames in
 *                arrival order: {frame: "open", properties, offered} and
 *                {frame: "close", error: {condition, description, info}}. With "retry_ms", a
 *                refused connect is tried again every 200 ms for up to that long; the result
 *                is the last attempt's.
 *   attach       {conn, link?, name, address, caps, durable?, selector?, no_local?, credit?,
 *                accept?, no_wait?}: a JMS consumer link named `name` (also its local id
 *                unless "link" is given): source {address, capabilities: caps, outcomes: the
 *                four, default-outcome modified(delivery-failed)}; "durable" -> durable=2
 *                (unsettled-state), expiry never, distribution-mode copy, else durable=0,
 *                expiry link-detach; filters jms-selector / no-local as described values with
 *                descriptors 0x468C00000004 / 0x468C00000003. snd-settle unsettled,
 *                rcv-settle first, empty target, credit window "credit" (default 10, like a
 *                prefetch); messages are accepted unless "accept" is false (then they stay
 *                unsettled until the link goes). Result: {attached, source (the broker's, or
 *                null), detached, error (of the refusing detach)}, or {} at once with
 *                "no_wait" (see "attached").
 *   lookup       {conn, link?, name, global?}: the unsubscribe lookup: a receiver named `name`
 *                with a NULL source on the connection's own session, desired capabilities
 *                [shared, global] when "global", no credit. Result as for attach.
 *   attached     {links}: waits for the answers to attaches sent with "no_wait": true (which
 *                return {} at once). Result: {links: {link: attach result}}.
 *   detach       {link, closed}: closed=false is detach() (a durable consumer going away),
 *                closed=true is close() (unsubscribe, or any other consumer). Waits for the
 *                broker's answering detach. Result: {closed (the broker's flag), error}.
 *   publish      {conn, address, bodies, properties?, caps? (default ["topic"]), sync?, ids?,
 *                pause_ms?}: a sender with target {address, capabilities}; sends persistent
 *                messages, waits for every outcome, closes the sender. With "sync", one at a
 *                time, the next only once the last was answered (MessageProducer.send of a
 *                persistent message), "pause_ms" apart; with "ids", each message has the
 *                message-id "ID:rhea:<body>". Result: {outcomes: ["accepted", ...], waited_ms:
 *                [how long each waited for its outcome], sent_at_ms: [when each was sent, ms
 *                since the epoch]}.
 *   receive      {links, count, linger_ms?}: waits (within the step timeout, not failing on it)
 *                until the links together got `count` new messages, then `linger_ms` (default
 *                300) more. Result: {received: {link: [bodies]}, properties: {link: [...]},
 *                delivery_counts: {link: [...]}}.
 *   close        {conn}: Close; waits for the broker's Close. Result: {error}.
 *   sleep        {ms}.
 */
'use strict';

const rhea = require('rhea');
const crypto = require('crypto');

const opts = JSON.parse(process.argv[2] || '{}');
const host = opts.host || '127.0.0.1';
const totalTimeoutMs = opts.timeout_ms || 20000;
const steps = opts.steps || [];

const JMS_DESIRED = [
  'sole-connection-for-container',
  'DELAYED_DELIVERY',
  'ANONYMOUS-RELAY',
  'SHARED-SUBS',
];
const SELECTOR_DESCRIPTOR = 0x468c00000004;
const NO_LOCAL_DESCRIPTOR = 0x468c00000003;
const OUTCOMES = [
  'amqp:accepted:list',
  'amqp:rejected:list',
  'amqp:released:list',
  'amqp:modified:list',
];
const ESTABLISHMENT_FAILED = 'amqp:connection-establishment-failed';

const results = [];
let current = -1;
let finished = false;
const connections = {};
const links = {};

// Exit only once the line is written: stdout to a pipe is asynchronous, and exiting at once
// would cut a long line at the pipe's buffer size.
function emitAndExit(result, code) {
  process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(code));
}

function fail(message) {
  if (finished) return;
  finished = true;
  emitAndExit({ ok: false, error: message, step: current, steps: results }, 2);
}

function succeed() {
  if (finished) return;
  finished = true;
  emitAndExit({ ok: true, steps: results }, 0);
}

// The hard bound: also keeps the process alive until succeed() or fail() exits it.
setTimeout(() => fail(`timed out after ${totalTimeoutMs} ms`), totalTimeoutMs);

function plain(value) {
  // JSON-safe copy (symbols, Buffers, described values and the like become plain data).
  if (value === undefined || value === null) return null;
  return JSON.parse(
    JSON.stringify(value, (k, v) => (typeof v === 'bigint' ? v.toString() : v)),
  );
}

function errorOf(err) {
  if (!err) return null;
  return {
    condition: err.condition === undefined ? null : String(err.condition),
    description: err.description === undefined ? null : err.description,
    info: plain(err.info),
  };
}

// Resolves when test() holds; test() is re-checked on every notify() of the run.
const waiters = new Set();
function notify() {
  for (const w of [...waiters]) {
    if (w.test()) {
      waiters.delete(w);
      clearTimeout(w.timer);
      w.resolve(true);
    }
  }
}
function until(test, ms, what, { soft = false } = {}) {
  return new Promise((resolve, reject) => {
    if (test()) {
      resolve(true);
      return;
    }
    const w = { test, resolve };
    w.timer = setTimeout(() => {
      waiters.delete(w);
      if (soft) resolve(false);
      else reject(new Error(`${what}: nothing within ${ms} ms`));
    }, ms);
    waiters.add(w);
  });
}
function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function connection(id) {
  const c = connections[id];
  if (!c) throw new Error(`no connection ${JSON.stringify(id)}`);
  return c;
}

function link(id) {
  const l = links[id];
  if (!l) throw new Error(`no link ${JSON.stringify(id)}`);
  return l;
}

const container = rhea.create_container({ id: `rhea-jms-${process.pid}` });
container.on('protocol_error', (context) => fail(`protocol_error: ${String(context.error)}`));
container.on('error', (context) => {
  const e = context && context.condition ? context : context && context.error;
  fail(`unexpected error: ${e ? `${e.condition || ''} ${e.description || e.message || e}` : '?'}`);
});

// Receiver link bookkeeping shared by attach and lookup.
function openReceiver(session, id, name, options) {
  const record = {
    id: id,
    remoteAttached: false,
    remoteDetached: false,
    source: null,
    detach: null,
    messages: [],
    taken: 0,
  };
  const receiver = session.open_receiver({ name: name, ...options });
  record.receiver = receiver;
  receiver.on('receiver_open', () => {
    record.remoteAttached = true;
    record.source = plain(receiver.source);
    notify();
  });
  receiver.on('receiver_error', () => {}); // the detach carries it; read in receiver_close
  receiver.on('receiver_close', () => {
    record.remoteDetached = true;
    const remote = receiver.remote.detach || {};
    record.detach = { closed: Boolean(remote.closed), error: errorOf(remote.error) };
    notify();
  });
  receiver.on('message', (context) => {
    record.messages.push({
      body: plain(context.message.body),
      properties: plain(context.message.application_properties),
      delivery_count: context.message.delivery_count || 0,
    });
    notify();
  });
  links[id] = record;
  return record;
}

async function attachResult(record, ms) {
  await until(() => record.remoteAttached || record.remoteDetached, ms, `attach ${record.id}`);
  if (record.source === null && !record.remoteDetached) {
    // A refusal: the null source is followed by a detach carrying the reason (facts §2.1).
    await until(() => record.remoteDetached, ms, `refusing detach of ${record.id}`, {
      soft: true,
    });
  }
  return {
    attached: record.remoteAttached,
    source: record.source,
    detached: record.remoteDetached,
    error: record.detach ? record.detach.error : null,
  };
}

async function connectOnce(step, ms) {
  const record = { id: step.conn, events: [], open: false, closed: false, ended: false };
  const c = container.connect({
    host: step.host || host,
    port: step.port,
    reconnect: false,
    container_id: step.container_id || `ID:${crypto.randomUUID()}:1`,
    desired_capabilities: step.desired || JMS_DESIRED,
    idle_time_out: 60000,
    max_frame_size: 1048576,
    channel_max: 32767,
    properties: { product: 'QpidJMS-rhea-test' },
  });
  record.connection = c;
  c.on('connection_open', () => {
    record.open = true;
    record.events.push({
      frame: 'open',
      properties: plain(c.properties),
      offered: plain(c.offered_capabilities),
    });
    notify();
  });
  c.on('connection_error', () => {}); // read from remote.close in connection_close
  c.on('connection_close', () => {
    record.closed = true;
    record.events.push({ frame: 'close', error: errorOf(c.remote.close && c.remote.close.error) });
    notify();
  });
  c.on('disconnected', () => {
    record.ended = true;
    notify();
  });
  connections[step.conn] = record;
  await until(() => record.open || record.closed || record.ended, ms, `open of ${step.conn}`);
  const properties = record.open ? record.events[0].properties || {} : {};
  const refused = !record.open || ESTABLISHMENT_FAILED in properties;
  if (refused) {
    await until(() => record.closed || record.ended, ms, `close of refused ${step.conn}`);
  }
  return { opened: record.open, refused: refused, events: record.events.slice() };
}

const ops = {
  async connect(step, ms) {
    // "retry_ms": while refused, try again every 200 ms for up to that long (attempts counted).
    const began = Date.now();
    let attempts = 0;
    for (;;) {
      attempts++;
      const result = await connectOnce(step, ms);
      if (!result.refused || Date.now() - began >= (step.retry_ms || 0)) {
        return { ...result, attempts: attempts };
      }
      await sleep(200);
    }
  },

  async attach(step, ms) {
    const c = connection(step.conn).connection;
    const source = {
      address: step.address,
      capabilities: step.caps,
      outcomes: OUTCOMES,
      default_outcome: rhea.message.modified({ delivery_failed: true }).described(),
    };
    if (step.durable) {
      source.durable = 2;
      source.expiry_policy = 'never';
      source.distribution_mode = 'copy';
    } else {
      source.durable = 0;
      source.expiry_policy = 'link-detach';
    }
    const filter = {};
    if (step.selector !== undefined && step.selector !== null) {
      filter['jms-selector'] = rhea.types.wrap_described(step.selector, SELECTOR_DESCRIPTOR);
    }
    if (step.no_local) {
      filter['no-local'] = rhea.types.wrap_described('NoLocalFilter{}', NO_LOCAL_DESCRIPTOR);
    }
    if (Object.keys(filter).length) source.filter = filter;
    const record = openReceiver(c, step.link || step.name, step.name, {
      source: source,
      snd_settle_mode: 0,
      rcv_settle_mode: 0,
      credit_window: step.credit === undefined ? 10 : step.credit,
      autoaccept: step.accept !== false,
    });
    if (step.no_wait) return {};
    return attachResult(record, ms);
  },

  async lookup(step, ms) {
    const record = connection(step.conn);
    if (!record.session) {
      record.session = record.connection.create_session(); // Qpid JMS's "connection session"
      record.session.begin();
    }
    const options = { source: null, snd_settle_mode: 0, rcv_settle_mode: 0, credit_window: 0 };
    if (step.global) options.desired_capabilities = ['shared', 'global'];
    const id = step.link || step.name;
    return attachResult(openReceiver(record.session, id, step.name, options), ms);
  },

  async attached(step, ms) {
    const answers = {};
    for (const id of step.links) answers[id] = await attachResult(link(id), ms);
    return { links: answers };
  },

  async detach(step, ms) {
    const record = link(step.link);
    if (step.closed) record.receiver.close();
    else record.receiver.detach();
    await until(() => record.remoteDetached, ms, `answering detach of ${step.link}`);
    return record.detach;
  },

  async publish(step, ms) {
    const c = connection(step.conn).connection;
    const bodies = step.bodies;
    const sender = c.open_sender({
      name: `qpid-jms:sender:${crypto.randomUUID()}:${step.address}`,
      target: { address: step.address, capabilities: step.caps || ['topic'] },
      snd_settle_mode: 0,
      rcv_settle_mode: 0,
    });
    const outcomes = new Array(bodies.length).fill(null);
    const sentAt = new Array(bodies.length).fill(null);
    const waited = new Array(bodies.length).fill(null);
    let sent = 0;
    let settled = 0;
    let senderError = null;
    let pausing = false;
    const pump = () => {
      while (sent < bodies.length && sender.sendable() && !pausing) {
        if (step.sync && settled < sent) return; // the last send is not answered yet
        const message = { body: bodies[sent], durable: true };
        if (step.properties) message.application_properties = step.properties[sent];
        if (step.ids) message.message_id = `ID:rhea:${bodies[sent]}`;
        sentAt[sent] = Date.now();
        sender.send(message).index = sent;
        sent++;
      }
    };
    sender.on('sendable', pump);
    for (const kind of ['accepted', 'rejected', 'released', 'modified']) {
      sender.on(kind, (context) => {
        const i = context.delivery.index;
        if (outcomes[i] === null) settled++;
        outcomes[i] = kind;
        waited[i] = Date.now() - sentAt[i];
        notify();
        if (step.sync && step.pause_ms) {
          pausing = true;
          setTimeout(() => {
            pausing = false;
            pump();
          }, step.pause_ms);
        } else if (step.sync) {
          pump();
        }
      });
    }
    sender.on('sender_error', () => {
      senderError = errorOf(sender.error);
      notify();
    });
    sender.on('sender_close', () => notify());
    await until(() => settled === bodies.length || senderError !== null, ms, 'outcomes');
    if (senderError) throw new Error(`sender refused: ${JSON.stringify(senderError)}`);
    sender.close();
    return { outcomes: outcomes, waited_ms: waited, sent_at_ms: sentAt };
  },

  async receive(step, ms) {
    const ids = step.links;
    const got = () => ids.reduce((n, id) => n + link(id).messages.length - link(id).taken, 0);
    await until(() => got() >= step.count, ms, 'messages', { soft: true });
    await sleep(step.linger_ms === undefined ? 300 : step.linger_ms);
    const received = {};
    const properties = {};
    const deliveryCounts = {};
    for (const id of ids) {
      const record = link(id);
      const fresh = record.messages.slice(record.taken);
      record.taken = record.messages.length;
      received[id] = fresh.map((m) => m.body);
      properties[id] = fresh.map((m) => m.properties);
      deliveryCounts[id] = fresh.map((m) => m.delivery_count);
    }
    return { received: received, properties: properties, delivery_counts: deliveryCounts };
  },

  async close(step, ms) {
    const record = connection(step.conn);
    const before = record.events.length;
    record.connection.close();
    await until(() => record.closed || record.ended, ms, `close of ${step.conn}`);
    const close = record.events.slice(before).find((e) => e.frame === 'close');
    return { error: close ? close.error : null };
  },

  async sleep(step) {
    await sleep(step.ms);
    return {};
  },
};

async function run() {
  for (let i = 0; i < steps.length; i++) {
    current = i;
    const step = steps[i];
    const op = ops[step.op];
    if (!op) throw new Error(`unknown op ${JSON.stringify(step.op)}`);
    const result = await op(step, step.timeout_ms || 5000);
    results.push({ op: step.op, ...result });
  }
}

run().then(succeed, (err) => fail(err && err.message ? err.message : String(err)));
