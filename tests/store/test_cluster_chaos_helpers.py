"""
The test cluster's slot migration (tests/support/redisclusters.py) does what the chaos tests
need: a slot moves key by key while a writer keeps writing to it, with a window between batches
where the source answers ASK, and the writer (redis-py's cluster client, following ASK and
TRYAGAIN) loses nothing it was told was written. Killing a primary is exercised by
test_sharded_notifications.py.
"""

import threading
import time

import redis
import redis.cluster
from redisclusters import ClusterGroup

from shoal_broker.store import connect, keys

WRITES = 3000
WRITE_SECONDS = 30.0
FILLER_KEYS = 40
"""Keys in the migrated slot besides the stream, so that it moves in several batches."""


def test_a_slot_migrates_under_writes_and_keeps_every_acknowledged_one(
    redis_cluster: ClusterGroup,
) -> None:
    k = keys.AddressKeys.of('busy-queue')
    stream = k.streams[0]
    slot = redis_cluster.keyslot(stream)
    source = redis_cluster.primary_of(stream)
    target = next(node for node in redis_cluster.primaries() if node is not source)
    writer = connect.sync_cluster_client(redis_cluster.url)
    for n in range(FILLER_KEYS):
        writer.set(f'{k.tag}:filler:{n}', n)
    written: list[bytes] = []
    stop = threading.Event()

    def write() -> None:
        deadline = time.monotonic() + WRITE_SECONDS
        while not stop.is_set() and len(written) < WRITES and time.monotonic() < deadline:
            written.append(writer.xadd(stream, {'n': len(written)}))

    asked: list[str] = []

    def between_batches() -> None:
        """The migration's window: a plain client asking the source for the slot's keys gets
        ASK for those already moved."""
        plain = source.client()
        try:
            for n in range(FILLER_KEYS):
                try:
                    plain.get(f'{k.tag}:filler:{n}')
                except redis.exceptions.AskError as exc:
                    asked.append(str(exc))
        finally:
            plain.close()
        time.sleep(0.05)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        time.sleep(0.2)  # the writer is under way
        moved = redis_cluster.migrate_slot(slot, target, batch=5, between_batches=between_batches)
    finally:
        stop.set()
        thread.join()
    try:
        assert moved >= FILLER_KEYS
        assert asked, 'no ASK seen between the batches'
        assert redis_cluster.owner_of_slot(slot) == target.port
        stored = [entry_id for entry_id, _ in writer.xrange(stream)]
        assert stored == written
        assert len(written) > 10
    finally:
        writer.delete(stream, *(f'{k.tag}:filler:{n}' for n in range(FILLER_KEYS)))
        writer.close()
