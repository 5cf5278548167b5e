"""
A message-group run over several replicas: producers send groups of numbered messages, consumers
(one thread and connection each) record everything they receive, and the ledger says per group
who received what, in which order, with which delivery-count and ``JMSXGroupFirstForConsumer``.

Used by the acceptance runs of message groups (tests/amqp/test_message_groups_chaos.py) on
standalone Redis and on a Redis Cluster.
"""

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence

from amqpclient import connect, receiver, sender
from proton import ConnectionException, Message, Timeout

FIRST = 'JMSXGroupFirstForConsumer'


@dataclasses.dataclass(frozen=True)
class Received:
    consumer: int
    group: str
    seq: int
    delivery_count: int
    first: bool


@dataclasses.dataclass
class GroupsRun:
    producer_urls: Sequence[str]
    consumer_urls: Sequence[str]
    address: str
    groups: int
    per_group: int
    credit: int = 10
    pause: float = 0.0
    """Seconds each consumer waits after each message (a backlog for a mid-run kill)."""
    ledger: list[Received] = dataclasses.field(default_factory=list)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    sent: int = 0
    attached: int = 0
    """Consumers whose link the broker has attached."""

    def _produce(self, index: int) -> None:
        conn = connect(self.producer_urls[index])
        snd = sender(conn, self.address)
        mine = [g for g in range(self.groups) if g % len(self.producer_urls) == index]
        for seq in range(self.per_group):
            for g in mine:
                snd.send(Message(body=f'g{g}:{seq}', group_id=f'g{g}', group_sequence=seq))
                with self.lock:
                    self.sent += 1
        conn.close()

    def _consume(self, index: int) -> None:
        try:
            conn = connect(self.consumer_urls[index])
            rcv = receiver(conn, self.address, credit=self.credit)
            with self.lock:
                self.attached += 1
            while not self.stop.is_set():
                try:
                    message = rcv.receive(timeout=0.5)
                except Timeout:
                    continue
                group, seq = message.body.split(':')
                first = bool((message.annotations or {}).get(FIRST))
                with self.lock:
                    self.ledger.append(
                        Received(index, group, int(seq), message.delivery_count, first)
                    )
                rcv.accept()
                if self.pause:
                    time.sleep(self.pause)
            conn.close()
        except ConnectionException:
            return  # its replica was killed

    def distinct(self) -> int:
        with self.lock:
            return len({(r.group, r.seq) for r in self.ledger})

    def run(self, during: Callable[['GroupsRun'], None], timeout: float, *,
            prefill: bool = False) -> None:  # fmt: skip
        """Start the consumers and producers (with ``prefill``, the producers first, to the
        end), call ``during`` (from this thread) while it runs, and return once every message
        was received or ``timeout`` s passed."""
        producers = [
            threading.Thread(target=self._produce, args=(i,), daemon=True)
            for i in range(len(self.producer_urls))
        ]
        consumers = [
            threading.Thread(target=self._consume, args=(i,), daemon=True)
            for i in range(len(self.consumer_urls))
        ]
        order = [*producers, *consumers] if prefill else [*consumers, *producers]
        for t in order:
            if not prefill and t is producers[0]:  # every consumer in place: each gets groups
                deadline = time.monotonic() + 30
                while self.attached < len(consumers) and time.monotonic() < deadline:
                    time.sleep(0.02)
            t.start()
            if prefill and t is producers[-1]:
                for p in producers:
                    p.join(timeout)
        during(self)
        deadline = time.monotonic() + timeout
        while self.distinct() < self.groups * self.per_group and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)  # a duplicate still on its way is counted too
        self.stop.set()
        for t in order:
            t.join(timeout=10)

    def by_group(self) -> dict[str, list[Received]]:
        found: dict[str, list[Received]] = collections.defaultdict(list)
        for r in self.ledger:
            found[r.group].append(r)
        return found

    def violations(self, dead: set[int]) -> list[str]:
        """What broke the rules of message groups; ``dead``: consumers whose replica was
        killed (their unsettled messages moved)."""
        wrong = []
        for group, got in self.by_group().items():
            seqs = {r.seq for r in got}
            if seqs != set(range(self.per_group)):
                wrong.append(f'{group}: lost {sorted(set(range(self.per_group)) - seqs)}')
            holders = list(dict.fromkeys(r.consumer for r in got))
            live = [c for c in holders if c not in dead]
            if len(live) > 1:
                wrong.append(f'{group}: held by {holders}')
            if len(holders) > 1 and holders[0] not in dead:
                wrong.append(f'{group}: moved off a live consumer {holders}')
            for consumer in holders:
                own = [r for r in got if r.consumer == consumer]
                order = [r.seq for r in own]
                if order != sorted(order) or len(set(order)) != len(order):
                    wrong.append(f'{group}: out of order at consumer {consumer}: {order}')
                if not own[0].first:
                    wrong.append(f'{group}: first at consumer {consumer} not marked')
            if len(holders) > 1:  # moved: the new owner starts at the oldest unsettled one
                before = [r.seq for r in got if r.consumer == holders[0]]
                after = [r for r in got if r.consumer == holders[1]]
                if after[0].seq > max(before) + 1:
                    wrong.append(f'{group}: a gap at the move {max(before)} -> {after[0].seq}')
                again = [r for r in after if r.seq in before]
                if any(r.delivery_count < 1 for r in again):
                    wrong.append(f'{group}: redelivered without delivery-count + 1')
        return wrong
