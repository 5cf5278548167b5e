"""
The loop turn: what the broker's parts leave to be written, credited or run in the background.

Store replies arrive in batches (one pipeline per loop turn); what they make writable is written
once at the end of the turn (``_flush``): connections given deliveries first, then the others,
and each producer whose stored messages freed credit is topped up once however many were
answered. Background work (store calls a reply waits for, leaves, moves) runs as tasks counted
here so that shutdown can wait for it (``settle_down``).

Everything runs on the one asyncio loop. This module knows connections and producer links only;
the parts (``connecting``, ``linking``, ``producing``, ``consuming``) call into it, never back.
"""

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from shoal_broker.amqp.connection import AmqpConnection
from shoal_broker.amqp.engine import lib
from shoal_broker.amqp.guard import Guard
from shoal_broker.amqp.links import ProducerLink


class Turns:
    def __init__(self, guard: Guard, producer_credit: int) -> None:
        self.guard = guard
        self.window = producer_credit
        """The credit a producer is kept at while the store keeps up."""
        self.accepting = True
        self.holding = False
        """True while sends are held through a store outage (``holding.py``): no new credit."""
        """False once the replica stops taking connections and attaches (``Broker.close_all``)."""
        self.loop = asyncio.get_running_loop()
        self._dirty: set[AmqpConnection] = set()
        self._delivering: set[AmqpConnection] = set()
        """Dirty connections with transfers to write: flushed first (see mark_delivering)."""
        self._flush_scheduled = False
        self._topping_up: set[ProducerLink] = set()
        """Producers whose stored messages free credit: topped up once per loop turn."""
        self._tasks: set[asyncio.Future[Any]] = set()

    def mark_dirty(self, conn: AmqpConnection) -> None:
        """Conn's engine has work from outside its own events: process it this loop turn."""
        self._dirty.add(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def mark_delivering(self, conn: AmqpConnection) -> None:
        """``mark_dirty`` for a connection given deliveries: it is written before the others.
        One store reply often both accepts a producer's message and hands it to a consumer;
        writing the accept first let the woken producer take the CPU before the consumer's
        transfer went out (2 vCPUs, docs/performance.md#flush-order)."""
        self._delivering.add(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def deliver_now(self, conn: AmqpConnection) -> None:
        """``mark_delivering`` for a transfer sent ahead (``Producing._send_ahead``): its bytes
        are written at once, before the store op is built and the producer's turn ends; the
        connection's events wait for the flush as ever. At a trickle the consumer's transfer
        then leaves ~25 µs earlier; under load at most two claims are in flight per
        subscription, so this is at most a write or two more per store cycle
        (docs/performance.md#trickle)."""
        conn.write_now()
        self.mark_delivering(conn)

    def forget(self, conn: AmqpConnection) -> None:
        """A connection is gone: nothing of it is written any more."""
        self._dirty.discard(conn)
        self._delivering.discard(conn)

    def _flush(self) -> None:
        if self._topping_up:  # before the swap below: their connections are dirty already
            producers, self._topping_up = self._topping_up, set()
            for producer in producers:
                if producer.alive:
                    self.top_up(producer)
        self._flush_scheduled = False
        delivering, self._delivering = self._delivering, set()
        dirty, self._dirty = self._dirty, set()
        for conn in delivering:
            if conn.alive:
                conn.process()
        for conn in dirty:
            if conn.alive and conn not in delivering:
                conn.process()

    def top_up(self, producer: ProducerLink) -> None:
        """Give a producer credit back as its messages are stored (the back-pressure valve),
        once it has used half its window: one flow frame per half window, not one per answer.
        A producer that sends one message and waits for its outcome (a synchronous JMS send)
        had been given a flow frame with every accept, which a peer's sender answers frame by
        frame (docs/performance.md#producer-credit)."""
        if self.guard.memory_high or self.holding or not self.accepting:  # credit again once
            return  # memory falls, or the store answers (Holding._stop tops every producer up);
            # none while stopping
        window = self.window
        credit = lib.pn_link_credit(producer.ptr)
        if credit > window // 2:  # half its window left: it is not waiting for credit
            return
        grant = window - producer.in_store - len(producer.waiting or ()) - credit
        if grant > 0:
            lib.pn_link_flow(producer.ptr, grant)
            self.mark_dirty(producer.conn)

    def top_up_later(self, producer: ProducerLink) -> None:
        """Credit back once per producer and loop turn, however many of its messages were
        answered meanwhile (one store reply often settles many: ``_flush``)."""
        if producer not in self._topping_up:
            self._topping_up.add(producer)
            self.mark_dirty(producer.conn)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> 'asyncio.Future[None]':
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def call_later(self, delay: float, callback: Callable[[], object]) -> None:
        self.loop.call_later(delay, callback)

    async def settle_down(self, bound_seconds: float) -> None:
        """Wait (bounded) for background work: refusals, leaves, moves to dead-letter queues."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=bound_seconds)
