"""
Every Prometheus metric the broker exports, in one place (names follow Prometheus conventions).

Labels: ``address``; ``subscription`` is ``queue`` for a queue, the subscription id for a named
JMS subscription and ``private`` for a plain topic subscriber (its per-link group name would make
every consumer a new series). Counting sits on the per-message path, so labelled children are
looked up once per address or subscription and cached (``Counters``), not per message.
"""

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import REGISTRY, GaugeMetricFamily
from prometheus_client.registry import Collector

from shoal_broker.metrics import records

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                   10, 30, 60, 300)  # fmt: skip

ENQUEUED = Counter('shoal_messages_enqueued', 'Messages stored for an address.', ['address'])
DROPPED = Counter(
    'shoal_messages_dropped', 'Messages published to a topic nobody subscribed to.', ['address']
)
DELIVERED = Counter(
    'shoal_messages_delivered', 'Transfers sent to consumers.', ['address', 'subscription']
)
SETTLED = Counter(
    'shoal_deliveries_settled',
    'Consumer outcomes: accepted (acknowledged), released, modified, rejected.',
    ['address', 'subscription', 'outcome'],
)
EXPIRED = Counter(
    'shoal_messages_expired', 'Messages whose TTL ran out before delivery.', ['address']
)
DEAD_LETTERED = Counter(
    'shoal_messages_dead_lettered',
    'Messages moved to the dead-letter address (rejected or past max delivery attempts).',
    ['address'],
)
FILTERED = Counter(
    'shoal_messages_filtered',
    "Messages a subscription's selector or no-local filter excluded.",
    ['address', 'subscription'],
)
LATENCY = Histogram(
    'shoal_delivery_latency_seconds',
    'From enqueue (stream entry time) to the consumer accepting the message.',
    ['address'],
    buckets=LATENCY_BUCKETS,
)
REDIS_ROUND_TRIP = Histogram(
    'shoal_redis_pipeline_seconds',
    'Round trip of one batched Redis pipeline (the per-message store path).',
    buckets=LATENCY_BUCKETS,
)
LEASE_UP = Gauge('shoal_replica_lease_up', 'Whether this replica holds its liveness lease.')


def subscription_label(group: str) -> str:
    return 'private' if group.startswith('nd:') else group


class Counters:
    """Labelled children of the hot-path metrics, cached per address and subscription, and plain
    tallies of the same events for the per-interval metric records (``records.py``)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], Any] = {}
        self.tallies: dict[tuple[str, str], dict[str, int]] = {}
        self.latencies: dict[tuple[str, str], list[int]] = {}

    def _tally(self, address: str, group: str, what: str) -> None:
        key = (address, subscription_label(group))
        tally = self.tallies.get(key)
        if tally is None:
            tally = self.tallies[key] = dict.fromkeys(records.COUNTS, 0)
        tally[what] += 1

    def take(
        self,
    ) -> tuple[dict[tuple[str, str], dict[str, int]], dict[tuple[str, str], list[int]]]:
        """The tallies since the last call (then reset)."""
        tallies, self.tallies = self.tallies, {}
        latencies, self.latencies = self.latencies, {}
        return tallies, latencies

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._cache.get(key)
        if child is None:
            child = self._cache[key] = metric.labels(*labels)
        return child

    def enqueued(self, address: str, group: str = 'queue') -> None:
        self._child(ENQUEUED, address).inc()
        self._tally(address, group, 'enqueued')

    def dropped(self, address: str) -> None:
        self._child(DROPPED, address).inc()

    def delivered(self, address: str, group: str) -> None:
        self._child(DELIVERED, address, subscription_label(group)).inc()
        self._tally(address, group, 'delivered')

    def settled(self, address: str, group: str, outcome: str) -> None:
        self._child(SETTLED, address, subscription_label(group), outcome).inc()
        self._tally(address, group, outcome)

    def expired(self, address: str, group: str = 'queue') -> None:
        self._child(EXPIRED, address).inc()
        self._tally(address, group, 'expired')

    def dead_lettered(self, address: str, group: str = 'queue') -> None:
        self._child(DEAD_LETTERED, address).inc()
        self._tally(address, group, 'dead_lettered')

    def filtered(self, address: str, group: str) -> None:
        self._child(FILTERED, address, subscription_label(group)).inc()
        self._tally(address, group, 'filtered')

    def latency(self, address: str, group: str, seconds: float) -> None:
        self._child(LATENCY, address).observe(seconds)
        key = (address, subscription_label(group))
        buckets = self.latencies.get(key)
        if buckets is None:
            buckets = self.latencies[key] = [0] * (len(records.LATENCY_BOUNDS) + 1)
        buckets[records.bucket_index(seconds)] += 1


Gauges = Callable[[], Iterable[tuple[str, str, list[str], list[tuple[list[str], float]]]]]
"""Yields (name, help, label names, [(label values, value), ...]) at scrape time."""


class ScrapeTimeGauges(Collector):
    """Gauges read from the broker's own state when Prometheus scrapes (never stale)."""

    def __init__(self, source: Gauges) -> None:
        self._source = source

    def collect(self) -> Iterable[GaugeMetricFamily]:
        for name, help_text, label_names, samples in self._source():
            family = GaugeMetricFamily(name, help_text, labels=label_names)
            for values, value in samples:
                family.add_metric(values, value)
            yield family


def register_gauges(source: Gauges) -> ScrapeTimeGauges:
    collector = ScrapeTimeGauges(source)
    REGISTRY.register(collector)
    return collector
