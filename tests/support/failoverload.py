"""The load the Redis failover chaos tests put through two broker replicas, and what they count
of it afterwards: which accepted bodies were lost, and which came twice with no reason a failover
explains. Shared so that every failover (Sentinel, Redis Cluster) is judged by the same rules."""

import collections
import dataclasses
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from loadclient import ChaosConsumer, ChaosProducer, ChaosRun

ROLLBACK_WINDOW = 1.0
"""Seconds before the kill within which a delivery may be undone by the failover (the last
fetches and acks a replica had not received)."""

REPLICATED = {'SHOAL_DURABILITY': 'replicated', 'SHOAL_REPLICATION_TIMEOUT_MS': '500'}
"""A broker's environment for ``replicated`` durability: a write counts once a replica has it."""

INVISIBLE = {**REPLICATED, 'SHOAL_DUPLICATE_DETECTION': 'true'}
"""``replicated`` durability (publishes, fetches and acks confirmed by a replica), the hold's
default bound and duplicate detection: a failover the applications should not see."""

RHEA_DIR = Path(__file__).resolve().parent.parent / 'rhea'


BODIES_APART = {'SHOAL_BIG_MESSAGE_BYTES': '1'}
"""A broker's environment that stores every message's body under a key of its own
(``store/bodies.py``), as it does a big message's."""


def crossed_load(
    a_url: str, b_url: str, queue: str, load: int, *, message_ids: bool = False
) -> ChaosRun:
    """Started: bodies ``0 .. load - 1`` sent to ``queue``, the even ones first through broker a
    and the odd ones first through b, and consumed by two consumers, one starting on each; every
    client moves to the other broker when its connection is lost. ``message_ids``: each body
    has a message-id of its own, the same when it is sent again."""
    return ChaosRun(
        [ChaosProducer([a_url, b_url], queue, range(0, load, 2), message_ids=message_ids),
         ChaosProducer([b_url, a_url], queue, range(1, load, 2), message_ids=message_ids)],
        [ChaosConsumer([a_url, b_url], queue, 'c0', credit=50),
         ChaosConsumer([b_url, a_url], queue, 'c1', credit=50)],
        timeout=100,
    ).start()  # fmt: skip


def synchronous_load(url: str, queue: str, count: int, timeout: float) -> ChaosRun:
    """Started: bodies ``0 .. count - 1`` sent to ``queue`` by one producer that waits for each
    outcome (as Qpid JMS sends a persistent message outside a transaction), and consumed by one
    consumer (credit 20), both on the broker at ``url``."""
    return ChaosRun(
        [ChaosProducer([url], queue, range(count), window=1)],
        [ChaosConsumer([url], queue, 'c0', credit=20)],
        timeout=timeout,
    ).start()


@dataclasses.dataclass(frozen=True)
class Tally:
    """What a run delivered, by body."""

    lost: set[Any]
    """Accepted and never received."""
    duplicates: set[Any]
    """Received more than once."""
    redelivered: set[Any]
    """Received at least once with a delivery count above zero."""
    redeliveries: int
    """Receipts with a delivery count above zero."""
    rolled_back: set[Any]
    """Accepted duplicates neither released (sent again) nor counted as redelivered."""
    unexplained: set[Any]
    """Those of ``rolled_back`` first received before the rollback window: a failover cannot
    have undone their first delivery."""


def tally(run: ChaosRun, since: float) -> Tally:
    """Counts ``run``; ``since`` is when Redis was broken (``time.monotonic()``).

    An accepted body comes twice as a counted redelivery, because it was released (written, not
    confirmed by a replica in time) and sent again, or because its first delivery was among the
    last fetches and acks the replica had not received when the primary died (not WAITed for:
    the promoted replica delivers it again, delivery count and all, as new)."""
    by_body = collections.Counter(r.body for r in run.receipts)
    duplicates = {body for body, n in by_body.items() if n > 1}
    redelivered = {r.body for r in run.receipts if r.delivery_count > 0}
    first_at: dict[Any, float] = {}
    for r in run.receipts:
        first_at.setdefault(r.body, r.at)
    rolled_back = (duplicates & run.accepted) - redelivered - run.released_bodies
    return Tally(
        lost=run.accepted - run.received,
        duplicates=duplicates,
        redelivered=redelivered,
        redeliveries=sum(1 for r in run.receipts if r.delivery_count > 0),
        rolled_back=rolled_back,
        unexplained={b for b in rolled_back if first_at[b] < since - ROLLBACK_WINDOW},
    )


@dataclasses.dataclass(frozen=True)
class Ledger:
    """Where every body of a run went (bodies, not deliveries)."""

    sent: int
    accepted: int
    released: int
    """Answered ``released`` at least once (then sent again)."""
    rejected: int
    in_doubt: int
    """Unanswered when the producer's connection went, and never accepted."""
    once: int
    """Received exactly once."""
    twice: int
    """Received more than once."""
    marked_first: int
    """First received with delivery-count >= 1 (a recovery counted an attempt)."""
    again_unmarked: int
    """Received again with delivery-count 0: a second copy, or an undone delivery unflagged."""
    lost: int
    """Accepted and never received."""

    def __str__(self) -> str:
        return ', '.join(f'{f.name.replace("_", " ")} {getattr(self, f.name)}'
                         for f in dataclasses.fields(self))  # fmt: skip


def ledger(run: ChaosRun, extra_accepted: frozenset[Any] = frozenset()) -> Ledger:
    """Counts ``run`` by body; ``extra_accepted``: bodies other producers (rhea) had accepted."""
    by_body = collections.Counter(r.body for r in run.receipts)
    seen: set[Any] = set()
    marked_first = again_unmarked = 0
    for receipt in sorted(run.receipts, key=lambda r: r.at):
        if receipt.body not in seen:
            marked_first += receipt.delivery_count > 0
        elif receipt.delivery_count == 0:
            again_unmarked += 1
        seen.add(receipt.body)
    accepted = run.accepted | extra_accepted
    return Ledger(
        sent=sum(len(p.bodies) for p in run.producers) + len(extra_accepted),
        accepted=len(accepted),
        released=len(run.released_bodies),
        rejected=len(run.rejected),
        in_doubt=len(run.in_doubt - run.accepted),
        once=sum(1 for n in by_body.values() if n == 1),
        twice=sum(1 for n in by_body.values() if n > 1),
        marked_first=marked_first,
        again_unmarked=again_unmarked,
        lost=len(accepted - run.received),
    )


def rhea_producer(
    url: str, queue: str, bodies: list[str], pause_ms: int
) -> 'subprocess.Popen[str]':
    """Started: a rhea producer (an AMQP implementation independent of proton) sending
    ``bodies`` to ``queue`` as Qpid JMS sends persistent messages, one at a time and each only
    once the last was answered, ``pause_ms`` apart, each with a message-id of its own; see
    ``rhea_outcomes``."""
    node = shutil.which('node')
    assert node is not None, 'node is not installed: run `make node-deps`'
    assert (RHEA_DIR / 'node_modules' / 'rhea').is_dir(), 'rhea is missing: run `make node-deps`'
    port = int(url.rsplit(':', 1)[1])
    steps = [
        {'op': 'connect', 'conn': 'p', 'port': port},
        {'op': 'publish', 'conn': 'p', 'address': queue, 'caps': ['queue'], 'bodies': bodies,
         'sync': True, 'ids': True, 'pause_ms': pause_ms, 'timeout_ms': 100_000},
    ]  # fmt: skip
    return subprocess.Popen(
        [node, 'jms.js', json.dumps({'timeout_ms': 110_000, 'steps': steps})],
        cwd=RHEA_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class RheaSends:
    outcomes: list[str]
    """Each body's outcome, in order."""
    waited_ms: list[int]
    """How long each send waited for its outcome."""
    sent_at_ms: list[int]
    """When each was sent (ms since the epoch)."""
    accepted: frozenset[str]


def rhea_outcomes(process: 'subprocess.Popen[str]', bodies: list[str]) -> RheaSends:
    """What the rhea producer of ``bodies`` got, once it exited; a refused link, a lost
    connection or a timeout fails the test with its report."""
    out, err = process.communicate(timeout=120)
    lines = out.strip().splitlines()
    assert len(lines) == 1, f'jms.js printed {len(lines)} lines\n{out}\n{err}'
    result = json.loads(lines[0])
    assert result['ok'] is True, f'{result}\n{err}'
    step = result['steps'][1]
    outcomes, waited = step['outcomes'], step['waited_ms']
    accepted = frozenset(b for b, o in zip(bodies, outcomes, strict=True) if o == 'accepted')
    return RheaSends(list(outcomes), list(waited), list(step['sent_at_ms']), accepted)


def stop_load(run: ChaosRun, rhea: 'subprocess.Popen[str] | None') -> None:
    """Stop the proton load and a rhea producer still sending (a test that failed midway)."""
    run.stop()
    if rhea is not None and rhea.poll() is None:
        rhea.kill()
        rhea.wait()


def receipts_of(run: ChaosRun, bodies: set[Any], since: float) -> str:
    """Each of ``bodies``' receipts: (consumer, broker, delivery-count, seconds after
    ``since``), to tell a failure's cause."""
    found: dict[Any, list[tuple[int, str, int, float]]] = collections.defaultdict(list)
    for r in run.receipts:
        if r.body in bodies:
            found[r.body].append((r.consumer, r.url, r.delivery_count, round(r.at - since, 2)))
    unmarked = [b for b, seen in found.items() if any(c == 0 for _, _, c, _ in seen[1:])]
    first = unmarked + sorted(set(found) - set(unmarked), key=str)  # the unflagged ones first
    return '; '.join(f'{body}: {found[body]}' for body in first[:10])
