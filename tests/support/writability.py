"""When the store could confirm a write, watched from outside while a failover chaos test runs,
and which synchronous sends took longer than that allowed.

In ``replicated`` mode a write counts once a Redis replica has it, so the store is back only
once the primary the clients are sent to has a replica online, not at the promotion alone: a
promoted primary without a replica confirms nothing. The sentinels may also promote twice for
one kill (a second promotion seconds after the first, whose new primary gets its replica back
only when the sentinels next reconfigure it, ~10 s later). A bound on each send is therefore
judged against the outages actually seen: a send must be answered within ``SLACK_MS`` of the
end of the last outage it overlapped (or of its own start). Every poll asks once
(``processes.ONE_ATTEMPT``): a call that retried a killed node blocked until it was back.
"""

import threading
import time
from collections.abc import Callable

import redis
from processes import LOOPBACK, ONE_ATTEMPT
from redisclusters import ClusterGroup
from sentinels import SentinelGroup

SLACK_MS = 2000
"""How long after the store can confirm writes again a held send may still wait."""

POLL_SECONDS = 0.05
BOUND_SECONDS = 600.0
"""The watch ends by itself after this long, whatever the test does."""


class Writability:
    """Polls ``writable`` in a thread from ``start`` to ``stop``; ``outages`` are the spans
    (epoch seconds, as rhea's ``Date.now()``) in which it was false. ``writable`` may note the
    primary it found with ``saw``: ``primaries`` is each change, to tell promotions apart."""

    def __init__(self, writable: Callable[['Writability'], bool]) -> None:
        self._writable = writable
        self.primaries: list[tuple[float, int | None]] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name='writability', daemon=True)
        self.outages: list[tuple[float, float]] = []
        self._down_since: float | None = None

    def start(self) -> 'Writability':
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)
        if self._down_since is not None:
            self.outages.append((self._down_since, time.time()))
            self._down_since = None

    def _watch(self) -> None:
        deadline = time.monotonic() + BOUND_SECONDS
        while not self._stopping.is_set() and time.monotonic() < deadline:
            now = time.time()
            try:
                up = self._writable(self)
            except (redis.exceptions.RedisError, OSError, LookupError):
                up = False
            if not up and self._down_since is None:
                self._down_since = now
            elif up and self._down_since is not None:
                self.outages.append((self._down_since, now))
                self._down_since = None
            self._stopping.wait(POLL_SECONDS)

    def saw(self, primary: int | None) -> None:
        if not self.primaries or self.primaries[-1][1] != primary:
            self.primaries.append((time.time(), primary))

    def summary(self) -> str:
        outages = ', '.join(f'{end - start:.2f} s' for start, end in self.outages) or 'none'
        if not self.primaries:
            return outages
        began = self.primaries[0][0]
        named = ', '.join(f'{port} at {at - began:.2f} s' for at, port in self.primaries)
        return f'{outages} (primaries named: {named})'

    def late_sends(self, sent_at_ms: list[int], waited_ms: list[int]) -> list[str]:
        """The sends answered more than ``SLACK_MS`` after the store could confirm writes again
        (after the end of the last outage each overlapped, or after its start)."""
        late = []
        for i, (sent, waited) in enumerate(zip(sent_at_ms, waited_ms, strict=True)):
            start, end = sent / 1000, (sent + waited) / 1000
            back = max([start, *(b for a, b in self.outages if a < end and b > start)])
            if end - back > SLACK_MS / 1000:
                late.append(
                    f'send {i} waited {waited} ms, {end - back:.2f} s after the store was back'
                )
        return late


def _has_online_replica(client: redis.Redis) -> bool:
    try:
        info = client.info('replication')
    finally:
        client.close()
    return info.get('role') == 'master' and any(
        isinstance(v, dict) and v.get('state') == 'online'
        for k, v in info.items()
        if k.startswith('slave')
    )


def sentinel_writability(group: SentinelGroup) -> Writability:
    """Writable: the primary the sentinels name has a replica online."""

    def writable(watch: Writability) -> bool:
        port = group.primary_port()
        watch.saw(port)
        if port is None:
            return False
        password = group.password or None
        return _has_online_replica(
            redis.Redis(
                host=LOOPBACK,
                port=port,
                socket_timeout=0.5,
                password=password,
                retry=ONE_ATTEMPT,
            )
        )

    return Writability(writable)


def cluster_writability(group: ClusterGroup, slot: int) -> Writability:
    """Writable: the primary serving ``slot`` has a replica online."""

    def writable(watch: Writability) -> bool:
        port = group.owner_of_slot(slot, retry=False)
        watch.saw(port)
        return _has_online_replica(group.node(port).client(0.5, retry=False))

    return Writability(writable)
