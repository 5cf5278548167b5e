"""
The per-message counters and the delivery latency histogram: plain ints and lists on the hot
path (``Counters``), turned into Prometheus families when Prometheus scrapes (``HotMetrics``),
and tallied again per interval for the metric records (``records.py``).

Every series is born at 0 before its first event, so ``increase()`` and ``rate()`` see that event
(a series first scraped at 5 counts as having been 5 all along): an address's counters when this
replica resolves it (``address_seen``), a subscription's when its first local consumer attaches
(``subscription_seen``), and, from the cluster-wide backlog snapshot, every queue's and
subscription's enqueued and dead-lettered counters (``entities_seen``), so the first dead letter
of a queue whose consumer attached and rejected between two scrapes is still seen.
Seeding happens when an entity appears, never per message.
"""

from collections.abc import Iterable

from prometheus_client.core import REGISTRY, CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from shoal_broker.metrics import _latency, records
from shoal_broker.metrics.labels import folded, subscription_label
from shoal_broker.metrics.links import link_deliveries_family
from shoal_broker.routing.storage import Entry

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                   10, 30, 60, 300, 900, 3600)  # fmt: skip
"""Seconds, for the broker's own timings (Redis round trips, event loop lag): sub-millisecond up
to an hour."""
_E12 = (1.0, 1.2, 1.5, 1.8, 2.2, 2.7, 3.3, 3.9, 4.7, 5.6, 6.8, 8.2)
_DECADES = sorted({round(m * 10.0**exponent, 6) for exponent in range(-4, 4) for m in _E12})
DELIVERY_LATENCY_BUCKETS = (*(bound for bound in _DECADES if 0.0005 <= bound < 3600), 3600.0)
"""Seconds, for the delivery latency: the E12 series (12 bounds a decade, neighbours at most 25 %
apart) from 0.56 ms to an hour, 83 buckets, so ``histogram_quantile``'s interpolation inside a
bucket stays within about 10 % of the true percentile (docs/analytics.md#latency)."""

_HOT_COUNTERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    'enqueued': ('shoal_messages_enqueued', 'Messages stored for an address.', ('address',)),
    'dropped': (
        'shoal_messages_dropped',
        'Messages published to a topic nobody subscribed to.',
        ('address',),
    ),
    'duplicate': (
        'shoal_messages_duplicate',
        'Messages dropped (and answered accepted) as duplicates of one stored within the window.',
        ('address',),
    ),
    'replaced': (
        'shoal_messages_replaced',
        'Messages of a last-value queue replaced, before any delivery, by a newer one with the '
        'same key.',
        ('address',),
    ),
    'delivered': (
        'shoal_messages_delivered',
        'Transfers sent to consumers.',
        ('address', 'subscription'),
    ),
    'settled': (
        'shoal_deliveries_settled',
        'Consumer outcomes: accepted (acknowledged), released, modified, rejected.',
        ('address', 'subscription', 'outcome'),
    ),
    'expired': (
        'shoal_messages_expired',
        'Messages whose TTL ran out before delivery.',
        ('address', 'subscription'),
    ),
    'dead_lettered': (
        'shoal_messages_dead_lettered',
        'Messages moved to the dead-letter address (rejected or past max delivery attempts).',
        ('address', 'subscription'),
    ),
    'filtered': (
        'shoal_messages_filtered',
        "Messages a subscription's selector or no-local filter excluded.",
        ('address', 'subscription'),
    ),
    'redelivery_delayed': (
        'shoal_messages_redelivery_delayed',
        'Messages given back that wait out a redelivery delay before their next delivery.',
        ('address', 'subscription'),
    ),
}
"""The per-message counters: plain ints here, turned into Prometheus families at scrape time
(a ``prometheus_client.Counter`` takes a lock per increment: 10 % of the broker's CPU under
load, docs/performance.md#metric-counters)."""

LATENCY_NAME = 'shoal_delivery_latency_seconds'
LATENCY_HELP = 'From enqueue (stream entry time) to the consumer accepting the message.'

_COUNTS: dict[tuple[str, ...], int] = {}
"""(counter, *label values) -> count since the process started, for every broker in it."""
_LATENCIES: dict[tuple[str, str], list[float]] = {}
"""(address, subscription label) -> per-bucket counts (``DELIVERY_LATENCY_BUCKETS`` and +Inf),
then the sum of seconds."""
_latency.configure(
    DELIVERY_LATENCY_BUCKETS,
    records.SKETCH_MULTIPLIER,
    records.SKETCH_MIN_SECONDS,
    records.SKETCH_MIN_INDEX,
)


class Counters:
    """Counts of the hot-path events (exported by ``HotMetrics`` at scrape time), and plain
    tallies of the same events for the per-interval metric records (``records.py``)."""

    def __init__(self) -> None:
        self.tallies: dict[tuple[str, str], dict[str, int]] = {}
        self.latencies: dict[tuple[str, str], dict[int, int]] = {}

    def _tally(self, address: str, group: str, what: str) -> None:
        self._tally_label(address, subscription_label(group), what)

    def _tally_label(self, address: str, label: str, what: str) -> None:
        key = (address, label)
        tally = self.tallies.get(key)
        if tally is None:
            tally = self.tallies[key] = dict.fromkeys(records.COUNTS, 0)
        tally[what] += 1

    def take(
        self,
    ) -> tuple[dict[tuple[str, str], dict[str, int]], dict[tuple[str, str], dict[int, int]]]:
        """The tallies since the last call (then reset)."""
        tallies, self.tallies = self.tallies, {}
        latencies, self.latencies = self.latencies, {}
        return tallies, latencies

    # The per-message events (enqueued, delivered, settled, latency) are written out inline:
    # two helper calls per event were ~1.5 µs per message.

    def enqueued(self, address: str, group: str = 'queue', count: int = 1) -> None:
        key = ('enqueued', address)
        _COUNTS[key] = _COUNTS.get(key, 0) + count
        tally = self.tallies.get((address, group))
        if tally is None:
            tally = self._new_tally(address, group)
        tally['enqueued'] += count

    def _new_tally(self, address: str, group: str) -> dict[str, int]:
        tally = self.tallies.get((address, subscription_label(group)))
        if tally is None:
            tally = dict.fromkeys(records.COUNTS, 0)
            self.tallies[(address, subscription_label(group))] = tally
        return tally

    def dropped(self, address: str, count: int = 1) -> None:
        key = ('dropped', address)
        _COUNTS[key] = _COUNTS.get(key, 0) + count

    def delivered(self, address: str, group: str, count: int = 1) -> None:
        label = 'private' if group.startswith('nd:') else group  # subscription_label
        key = ('delivered', address, label)
        _COUNTS[key] = _COUNTS.get(key, 0) + count
        tally = self.tallies.get((address, label))
        if tally is None:
            tally = self._new_tally(address, group)
        tally['delivered'] += count

    def settled(self, address: str, group: str, outcome: str) -> None:
        label = 'private' if group.startswith('nd:') else group  # subscription_label
        key = ('settled', address, label, outcome)
        _COUNTS[key] = _COUNTS.get(key, 0) + 1
        tally = self.tallies.get((address, label))
        if tally is None:
            tally = self._new_tally(address, group)
        tally[outcome] += 1

    def expired(self, address: str, group: str = 'queue') -> None:
        _count(('expired', address, subscription_label(group)))
        self._tally(address, group, 'expired')

    def dead_lettered(self, address: str, group: str = 'queue') -> None:
        _count(('dead_lettered', address, subscription_label(group)))
        self._tally(address, group, 'dead_lettered')

    def filtered(self, address: str, group: str) -> None:
        _count(('filtered', address, subscription_label(group)))
        self._tally(address, group, 'filtered')

    def redelivery_delayed(self, address: str, group: str) -> None:
        _count(('redelivery_delayed', address, subscription_label(group)))

    def accepted_all(self, address: str, group: str, entries: list[Entry], now: float) -> None:
        """Accepted deliveries of one subscription, each ``now`` less its enqueue (its stream
        id's time) after it: the settled count, and, in C (``_latency.record``), the Prometheus
        histogram (one bisection) and the records' sketch (``records.sketch_index``), the
        lookups once for them all. This runs for every message: per message, two calls were
        ~2.5 µs, and the loop in Python 0.45-1.25 µs an entry
        (docs/performance.md#latencies-counted-in-c)."""
        label = 'private' if group.startswith('nd:') else group  # subscription_label
        key = ('settled', address, label, 'accepted')
        _COUNTS[key] = _COUNTS.get(key, 0) + len(entries)
        tally = self.tallies.get((address, label))
        if tally is None:
            tally = self._new_tally(address, group)
        tally['accepted'] += len(entries)
        histogram = _LATENCIES.get((address, label))
        if histogram is None:
            histogram = _LATENCIES[(address, label)] = [0.0] * (len(DELIVERY_LATENCY_BUCKETS) + 2)
        sketch = self.latencies.get((address, label))
        if sketch is None:
            sketch = self.latencies[(address, label)] = {}
        _latency.record(entries, now, histogram, sketch)


OUTCOMES = ('accepted', 'released', 'modified', 'rejected')
"""The ``outcome`` label values of ``shoal_deliveries_settled``."""


def address_seen(address: str, *, topic: bool) -> None:
    """An address this replica resolved: its counters exist from now on (0 until counted)."""
    _COUNTS.setdefault(('enqueued', address), 0)
    if topic:
        _COUNTS.setdefault(('dropped', address), 0)


def subscription_seen(address: str, group: str) -> None:
    """A queue or subscription with a consumer on this replica: its counters and latency
    histogram exist from now on."""
    label = subscription_label(group)
    for what in ('delivered', 'expired', 'dead_lettered', 'filtered', 'redelivery_delayed'):
        _COUNTS.setdefault((what, address, label), 0)
    for outcome in OUTCOMES:
        _COUNTS.setdefault(('settled', address, label, outcome), 0)
    if (address, label) not in _LATENCIES:
        _LATENCIES[(address, label)] = [0.0] * (len(DELIVERY_LATENCY_BUCKETS) + 2)


def entities_seen(entities: Iterable[tuple[str, str]]) -> None:
    """Every (address, subscription label) in Redis, cluster-wide: the dead-letter counter (what
    ``ShoalDeadLetterQueueFilling`` watches) and its address's enqueued count exist on every
    replica, whether or not one of its consumers ever attaches here. The rest wait for a local
    consumer (``subscription_seen``): only a replica with one counts them, and each series costs
    every scrape its bytes (tests/security/test_address_limits.py bounds them)."""
    for address, label in entities:
        _COUNTS.setdefault(('enqueued', address), 0)
        _COUNTS.setdefault(('dead_lettered', address, label), 0)


def duplicates_dropped(address: str, count: int) -> None:
    """Duplicates dropped at an address with duplicate detection; 0 creates its series, so that
    an alert on the rate sees the address from its first publish."""
    key = ('duplicate', address)
    _COUNTS[key] = _COUNTS.get(key, 0) + count


def values_replaced(address: str, count: int) -> None:
    """Messages a last-value queue replaced; 0 creates its series at the queue's first publish."""
    key = ('replaced', address)
    _COUNTS[key] = _COUNTS.get(key, 0) + count


def _count(key: tuple[str, ...]) -> None:
    _COUNTS[key] = _COUNTS.get(key, 0) + 1


class HotMetrics(Collector):
    """The per-message counters and the delivery latency histogram, read at scrape time."""

    def collect(self) -> Iterable[CounterMetricFamily | HistogramMetricFamily]:
        counts: dict[tuple[str, ...], float] = {}
        for (what, *values), count in list(_COUNTS.items()):
            key = (what, *folded(_HOT_COUNTERS[what][2], values))
            counts[key] = counts.get(key, 0) + count
        families = {
            what: CounterMetricFamily(name, help_text, labels=list(labels))
            for what, (name, help_text, labels) in _HOT_COUNTERS.items()
        }
        for (what, *values), total in counts.items():
            families[what].add_metric(values, total)
        yield from families.values()
        latency_labels = ['address', 'subscription']
        histograms: dict[tuple[str, ...], list[float]] = {}
        for pair, histogram in list(_LATENCIES.items()):
            key = folded(latency_labels, pair)
            if key in histograms:
                histograms[key] = [a + b for a, b in zip(histograms[key], histogram, strict=True)]
            else:
                histograms[key] = histogram
        latency = HistogramMetricFamily(LATENCY_NAME, LATENCY_HELP, labels=latency_labels)
        for (address, label), histogram in histograms.items():
            cumulative, buckets = 0.0, []
            for bound, in_bucket in zip(
                (*DELIVERY_LATENCY_BUCKETS, float('inf')), histogram, strict=False
            ):
                cumulative += in_bucket
                buckets.append((floatToGoString(bound), cumulative))  # type: ignore[no-untyped-call]
            latency.add_metric([address, label], buckets, histogram[-1])
        yield latency
        yield link_deliveries_family()


REGISTRY.register(HotMetrics())
