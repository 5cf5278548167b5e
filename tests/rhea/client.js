#!/usr/bin/env node
/*
 * A small, bounded rhea client for Shoal's tests (rhea is an AMQP 1.0 implementation independent
 * of proton). Usage:
 *
 *   node client.js '{"port": 5672, "address": "q", "mode": "roundtrip", "count": 100}'
 *
 * Prints exactly one JSON line on stdout: {"ok": true, ...results} on success, or
 * {"ok": false, "error": "..."} on error or timeout, and then exits non-zero.
 *
 * Modes:
 *   roundtrip  receiver, then (once it is attached) sender on one connection; send `count`
 *              messages (body "m<i>", application_properties {i}, message_annotations),
 *              record every settlement outcome, receive them all (auto accept); reports
 *              outcomes, bodies in arrival order, delivery counts, application properties and
 *              annotations seen.
 *   send       send `count` messages; reports each outcome (with error condition if any).
 *   receive    receive `count` messages with a credit window of `credit` (default 10); reports
 *              bodies, delivery counts, properties and annotations. `linger_ms` keeps the link
 *              open that long afterwards and reports any further message in `extra` (accepted
 *              too, so duplicates are visible).
 *   drain      attach a receiver with no credit, then drain with 10 credits; reports how many
 *              milliseconds until the broker's drained flow and the messages received.
 *   temporary  attach a receiver with a dynamic source, send one message to the address the
 *              broker assigned (on a separate sender), receive it; reports address and body.
 *
 * Other options: "presettled" (roundtrip: both links settle on send, snd-settle-mode settled,
 * and a send counts as done once written: outcome "presettled"), "host" (default 127.0.0.1),
 * "username" and "password" (SASL PLAIN),
 * "timeout_ms" (default 20000, hard overall bound),
 * "body_prefix" (default "m"), "start" (first index, default 0).
 */
'use strict';

const rhea = require('rhea');

const opts = JSON.parse(process.argv[2] || '{}');
const host = opts.host || '127.0.0.1';
const port = opts.port;
const address = opts.address;
const mode = opts.mode;
const count = opts.count === undefined ? 1 : opts.count;
const timeoutMs = opts.timeout_ms || 20000;
const prefix = opts.body_prefix === undefined ? 'm' : opts.body_prefix;
const start = opts.start || 0;

let finished = false;
let connection = null;

function emit(result) {
  process.stdout.write(JSON.stringify(result) + '\n');
}

function fail(message) {
  if (finished) return;
  finished = true;
  emit({ ok: false, mode: mode, error: message });
  process.exit(2);
}

// Close the connection cleanly (so accepts reach the broker before the socket goes), then print.
function finish(result) {
  if (finished) return;
  finished = true;
  result.ok = true;
  result.mode = mode;
  const done = () => {
    emit(result);
    process.exit(0);
  };
  if (connection && connection.is_open()) {
    connection.once('connection_close', done);
    connection.once('disconnected', done);
    connection.close();
  } else {
    done();
  }
}

// The hard bound: also keeps the process alive until finish() or fail() exits it.
setTimeout(() => fail(`timed out after ${timeoutMs} ms`), timeoutMs);

function message(i) {
  return {
    body: `${prefix}${i}`,
    application_properties: { i: i },
    message_annotations: { 'x-opt-rhea-test': 'rhea', 'x-opt-rhea-index': i },
  };
}

function outcome(context, kind) {
  const out = { outcome: kind };
  const state = context.delivery.remote_state;
  if (state && state.error) {
    out.condition = state.error.condition === undefined ? null : String(state.error.condition);
    out.description = state.error.description === undefined ? null : state.error.description;
  }
  if (kind === 'modified' && state) {
    out.delivery_failed = Boolean(state.delivery_failed);
    out.undeliverable_here = Boolean(state.undeliverable_here);
  }
  return out;
}

function deliveryCount(msg) {
  return msg.delivery_count === undefined || msg.delivery_count === null ? 0 : msg.delivery_count;
}

function plain(value) {
  // JSON-safe copy (symbols, Buffers and the like become strings).
  if (value === undefined || value === null) return null;
  return JSON.parse(
    JSON.stringify(value, (k, v) => (typeof v === 'bigint' ? v.toString() : v)),
  );
}

// Sends count messages as credit allows; calls onOutcome(index, outcome) once per delivery.
function sendAll(sender, onOutcome) {
  let sent = 0;
  const pump = () => {
    while (sent < count && sender.sendable()) {
      const index = sent;
      const delivery = sender.send(message(start + index));
      delivery.index = index;
      sent++;
      if (opts.presettled) onOutcome(index, { outcome: 'presettled' });
    }
  };
  sender.on('sendable', pump);
  for (const kind of ['accepted', 'rejected', 'released', 'modified']) {
    sender.on(kind, (context) => onOutcome(context.delivery.index, outcome(context, kind)));
  }
}

const modes = {
  roundtrip() {
    const outcomes = new Array(count).fill(null);
    let settled = 0;
    const received = { bodies: [], delivery_counts: [], properties: [], annotations: [] };
    const check = () => {
      if (settled === count && received.bodies.length >= count) {
        finish({ outcomes: outcomes, ...received });
      }
    };
    const settleMode = opts.presettled ? { snd_settle_mode: 1 } : {};
    const receiver = connection.open_receiver({ source: { address: address }, ...settleMode });
    receiver.on('message', (context) => {
      const msg = context.message;
      received.bodies.push(plain(msg.body));
      received.delivery_counts.push(deliveryCount(msg));
      received.properties.push(plain(msg.application_properties));
      received.annotations.push(plain(msg.message_annotations));
      check();
    });
    // The sender opens once the broker has answered the receiver's attach, as Qpid JMS's
    // createConsumer waits for it: opened together, the broker resolves both attaches at once
    // and may grant the sender credit before the receiver is a consumer (1 run in 60).
    receiver.once('receiver_open', () => {
      const sender = connection.open_sender({ target: { address: address }, ...settleMode });
      sendAll(sender, (index, out) => {
        if (outcomes[index] === null) settled++;
        outcomes[index] = out;
        check();
      });
    });
  },

  send() {
    const outcomes = new Array(count).fill(null);
    let settled = 0;
    const sender = connection.open_sender({ target: { address: address } });
    sendAll(sender, (index, out) => {
      if (outcomes[index] === null) settled++;
      outcomes[index] = out;
      if (settled === count) finish({ outcomes: outcomes });
    });
  },

  receive() {
    const credit = opts.credit || 10;
    const linger = opts.linger_ms || 0;
    const bodies = [];
    const deliveryCounts = [];
    const properties = [];
    const annotations = [];
    const extra = [];
    const receiver = connection.open_receiver({
      source: { address: address },
      credit_window: credit,
    });
    receiver.on('message', (context) => {
      if (bodies.length < count) {
        bodies.push(plain(context.message.body));
        deliveryCounts.push(deliveryCount(context.message));
        properties.push(plain(context.message.application_properties));
        annotations.push(plain(context.message.message_annotations));
        if (bodies.length === count) {
          const report = () =>
            finish({
              bodies: bodies,
              delivery_counts: deliveryCounts,
              properties: properties,
              annotations: annotations,
              extra: extra,
            });
          if (linger > 0) setTimeout(report, linger);
          else report();
        }
      } else {
        extra.push(plain(context.message.body));
      }
    });
  },

  drain() {
    const bodies = [];
    let began = null;
    const receiver = connection.open_receiver({
      source: { address: address },
      credit_window: 0,
    });
    receiver.on('receiver_open', () => {
      began = process.hrtime.bigint();
      receiver.drain = true;
      receiver.add_credit(10);
    });
    receiver.on('message', (context) => bodies.push(plain(context.message.body)));
    receiver.on('receiver_drained', () => {
      const ms = Number(process.hrtime.bigint() - began) / 1e6;
      finish({ drained_ms: ms, received: bodies.length, bodies: bodies, credit: receiver.credit });
    });
  },

  temporary() {
    const receiver = connection.open_receiver({ source: { dynamic: true } });
    let assigned = null;
    receiver.on('receiver_open', () => {
      assigned = receiver.source ? receiver.source.address : undefined;
      if (!assigned) {
        fail('the broker assigned no address to the dynamic source');
        return;
      }
      const sender = connection.open_sender({ target: { address: assigned } });
      let sent = false;
      sender.on('sendable', () => {
        if (!sent) {
          sent = true;
          sender.send({ body: `${prefix}temporary` });
        }
      });
      sender.on('rejected', (context) => fail(`rejected: ${JSON.stringify(outcome(context, 'rejected'))}`));
      sender.on('released', () => fail('the message to the temporary queue was released'));
    });
    receiver.on('message', (context) => {
      finish({ address: assigned, body: plain(context.message.body) });
    });
  },
};

if (!modes[mode]) fail(`unknown mode ${JSON.stringify(mode)}`);
if (!port) fail('no port given');

const container = rhea.create_container({ id: `rhea-test-${process.pid}` });
for (const event of ['connection_error', 'session_error', 'sender_error', 'receiver_error']) {
  container.on(event, (context) => {
    // the peer's close carries its error on the endpoint; a transport error (a SASL outcome
    // other than ok) comes only with the event
    const err = context[event.split('_')[0]].error || context.error;
    fail(`${event}: ${JSON.stringify(plain(err))}`);
  });
}
container.on('protocol_error', (context) => fail(`protocol_error: ${String(context.error)}`));
container.on('error', (context) => fail(`error: ${String(context.error)}`));
container.on('disconnected', (context) => {
  if (!finished) fail(`disconnected: ${context.error ? String(context.error) : 'no error given'}`);
});

// username and password (both set) make rhea authenticate with SASL PLAIN, else ANONYMOUS
connection = container.connect({
  host: host, port: port, reconnect: false, username: opts.username, password: opts.password,
});
modes[mode]();
