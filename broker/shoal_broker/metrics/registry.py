"""
Every Prometheus metric the broker exports, in one place (names follow Prometheus conventions).

Labels: ``address``; ``subscription`` is ``queue`` for a queue, the subscription id for a named
JMS subscription and ``private`` for a plain topic subscriber (its per-link group name would make
every consumer a new series). Only the first ``cap_address_series`` addresses get series of
their own; the rest are added up under ``address="_other"``, so a scrape stays bounded however
many addresses a client creates. ``link`` (``shoal_consumer_deliveries``) is a consumer link's
AMQP name, for at most ``cap_consumer_link_series`` attached links; the series of a link goes when
it detaches. Counting sits on the per-message path, so labelled children are
looked up once per address or subscription and cached (``Counters``), not per message.
"""

import bisect
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from shoal_broker.errors import BrokerError, StoreFull
from shoal_broker.metrics import records

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                   10, 30, 60, 300, 900, 3600)  # fmt: skip
"""Seconds: sub-millisecond deliveries up to an hour's wait (a backlog nobody drains), so the
top finite bucket does not hide real waits."""

_HOT_COUNTERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    'enqueued': ('shoal_messages_enqueued', 'Messages stored for an address.', ('address',)),
    'dropped': (
        'shoal_messages_dropped',
        'Messages published to a topic nobody subscribed to.',
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
}
"""The per-message counters: plain ints here, turned into Prometheus families at scrape time
(a ``prometheus_client.Counter`` takes a lock per increment: 10 % of the broker's CPU under
load, docs/performance.md#metric-counters)."""

LATENCY_NAME = 'shoal_delivery_latency_seconds'
LATENCY_HELP = 'From enqueue (stream entry time) to the consumer accepting the message.'

_COUNTS: dict[tuple[str, ...], int] = {}
"""(counter, *label values) -> count since the process started, for every broker in it."""
_LATENCIES: dict[tuple[str, str], list[float]] = {}
"""(address, subscription label) -> per-bucket counts (``LATENCY_BUCKETS`` and +Inf), then the
sum of seconds."""

REDIS_ROUND_TRIP = Histogram(
    'shoal_redis_pipeline_seconds',
    'Round trip of one batched Redis pipeline (the per-message store path).',
    buckets=LATENCY_BUCKETS,
)
LEASE_UP = Gauge('shoal_replica_lease_up', 'Whether this replica holds its liveness lease.')
BACKGROUND_FAILURES = Counter(
    'shoal_background_task_failures',
    'Failed rounds of a background safety task (lease, store_memory, trim, policies, reaping).',
    ['task'],
)
LOGINS_REFUSED = Counter(
    'shoal_logins_refused',
    'Connections refused before they were authenticated: failed (wrong credentials) or '
    'throttled (their source address failed too often within a minute).',
    ['reason'],
)
LOOP_LAG = Histogram(
    'shoal_event_loop_lag_seconds',
    'How late the event loop ran a timer (sampled every 100 ms): time it spent on other work.',
    buckets=LATENCY_BUCKETS,
)
REDIS_UP = Gauge(
    'shoal_redis_up',
    'Whether this replica reached Redis at its last lease renewal (every third of the lease).',
)


# Every analytics record bound is a Prometheus bucket bound, so one bisection serves both
# histograms of an accepted delivery: the record bucket follows from the Prometheus one.
assert set(records.LATENCY_BOUNDS) <= set(LATENCY_BUCKETS)
_RECORD_BUCKET = (
    *(bisect.bisect_left(records.LATENCY_BOUNDS, bound) for bound in LATENCY_BUCKETS),
    len(records.LATENCY_BOUNDS),
)
"""Prometheus bucket index (``LATENCY_BUCKETS`` then +Inf) -> ``records.LATENCY_BOUNDS`` index."""


PRIVATE_LABEL = 'private'
"""The ``subscription`` label of every plain topic subscriber's private group."""


def subscription_label(group: str) -> str:
    return PRIVATE_LABEL if group.startswith('nd:') else group


class Counters:
    """Counts of the hot-path events (exported by ``HotMetrics`` at scrape time), and plain
    tallies of the same events for the per-interval metric records (``records.py``)."""

    def __init__(self) -> None:
        self.tallies: dict[tuple[str, str], dict[str, int]] = {}
        self.latencies: dict[tuple[str, str], list[int]] = {}

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
    ) -> tuple[dict[tuple[str, str], dict[str, int]], dict[tuple[str, str], list[int]]]:
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

    def accepted_all(self, address: str, group: str, ages: Sequence[float]) -> None:
        """Accepted deliveries of one subscription, each the given seconds after its enqueue: the
        settled count and both latency histograms (Prometheus and records, per subscription),
        one bisection per delivery and the lookups once for them all (this runs for every
        message: per message, two calls were ~2.5 µs)."""
        label = 'private' if group.startswith('nd:') else group  # subscription_label
        key = ('settled', address, label, 'accepted')
        _COUNTS[key] = _COUNTS.get(key, 0) + len(ages)
        tally = self.tallies.get((address, label))
        if tally is None:
            tally = self._new_tally(address, group)
        tally['accepted'] += len(ages)
        histogram = _LATENCIES.get((address, label))
        if histogram is None:
            histogram = _LATENCIES[(address, label)] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        buckets = self.latencies.get((address, label))
        if buckets is None:
            buckets = self.latencies[(address, label)] = [0] * (len(records.LATENCY_BOUNDS) + 1)
        for seconds in ages:
            if seconds < 0:  # a clock that stepped back
                seconds = 0.0
            bucket = bisect.bisect_left(LATENCY_BUCKETS, seconds)
            histogram[bucket] += 1
            histogram[-1] += seconds
            buckets[_RECORD_BUCKET[bucket]] += 1


def _count(key: tuple[str, ...]) -> None:
    _COUNTS[key] = _COUNTS.get(key, 0) + 1


OTHER_ADDRESSES = '_other'
"""The ``address`` (and ``subscription``) label of the series added up past the address cap."""

_address_cap = 1000
_admitted: set[str] = set()


def cap_address_series(cap: int) -> None:
    """Give at most ``cap`` addresses series of their own (0: no cap)."""
    global _address_cap
    _address_cap = cap


def _address_label(address: str) -> str:
    """``address``, or OTHER_ADDRESSES once the cap is full: the first addresses seen keep their
    series for good, so every series (the aggregate too) only grows, as a counter must."""
    if not _address_cap or address in _admitted:
        return address
    if len(_admitted) < _address_cap:
        _admitted.add(address)
        return address
    return OTHER_ADDRESSES


def _folded(label_names: Sequence[str], values: Sequence[str]) -> tuple[str, ...]:
    """Label values with a capped address (and its subscription) folded into the aggregate."""
    if not values or label_names[0] != 'address':
        return tuple(values)
    address = _address_label(values[0])
    if address == values[0]:
        return tuple(values)
    rest = list(values[1:])
    if len(label_names) > 1 and label_names[1] == 'subscription':
        rest[0] = OTHER_ADDRESSES
    return (address, *rest)


OTHER_LINKS = '_other'
"""The ``link`` label of the deliveries of consumer links past the per-replica cap."""

LINK_LABEL_LENGTH = 256
"""Characters of a link name kept in its ``link`` label (AMQP allows names as long as a frame)."""

LINK_DELIVERIES_NAME = 'shoal_consumer_deliveries'
LINK_DELIVERIES_HELP = (
    'Transfers sent on each consumer link attached to this replica, by AMQP link name. A series '
    'lives as long as its link: it is dropped when the link detaches (a reattached consumer starts '
    'a new series from 0). Past the per-replica cap (SHOAL_METRICS_MAX_CONSUMER_LINKS), and for a '
    'name another attached link of the subscription already has, links count under '
    'link="_other", which keeps the deliveries of its detached links.'
)


class LinkDeliveries:
    """What one consumer link was sent: ``count`` is raised on the per-message path (an attribute
    increment), read at scrape time."""

    __slots__ = ('address', 'count', 'link', 'subscription')

    def __init__(self, address: str = '', subscription: str = '', link: str = OTHER_LINKS) -> None:
        self.address = address
        self.subscription = subscription
        self.link = link
        self.count = 0


_link_cap = 200
_LINKS: dict[tuple[str, str, str], LinkDeliveries] = {}
"""(address, subscription, link) label values -> the attached link with a series of its own."""
_FOLDED: set[LinkDeliveries] = set()
"""Attached links counted under ``link="_other"``."""
_FOLDED_GONE: dict[tuple[str, str], int] = {}
"""(address, subscription) -> deliveries of detached links that counted under ``_other``."""


def cap_consumer_link_series(cap: int) -> None:
    """Give at most ``cap`` attached consumer links a series of their own (0: no cap)."""
    global _link_cap
    _link_cap = cap


def link_attached(address: str, group: str, name: str) -> LinkDeliveries:
    """The counter of a consumer link that attached: a series of its own while fewer than the
    cap's links have one and its name is free, else one of ``_other``'s for its whole life
    (so no count ever moves between series)."""
    address, label = _folded(('address', 'subscription'), (address, subscription_label(group)))
    key = (address, label, name[:LINK_LABEL_LENGTH])
    room = not _link_cap or len(_LINKS) < _link_cap
    free = key not in _LINKS and key[2] != OTHER_LINKS  # a link named "_other" joins it
    if room and free and address != OTHER_ADDRESSES:
        deliveries = _LINKS[key] = LinkDeliveries(*key)
    else:
        deliveries = LinkDeliveries(address, label)
        _FOLDED.add(deliveries)
    return deliveries


def link_detached(deliveries: LinkDeliveries) -> None:
    """Drop the series of a detached link; ``_other`` keeps what its folded links were sent."""
    key = (deliveries.address, deliveries.subscription, deliveries.link)
    if _LINKS.get(key) is deliveries:
        del _LINKS[key]
    elif deliveries in _FOLDED:
        _FOLDED.discard(deliveries)
        pair = (deliveries.address, deliveries.subscription)
        _FOLDED_GONE[pair] = _FOLDED_GONE.get(pair, 0) + deliveries.count


def _link_deliveries() -> CounterMetricFamily:
    family = CounterMetricFamily(
        LINK_DELIVERIES_NAME, LINK_DELIVERIES_HELP, labels=['address', 'subscription', 'link']
    )
    for key, deliveries in list(_LINKS.items()):
        family.add_metric(list(key), deliveries.count)
    folded = dict(_FOLDED_GONE)
    for deliveries in list(_FOLDED):
        pair = (deliveries.address, deliveries.subscription)
        folded[pair] = folded.get(pair, 0) + deliveries.count
    for (address, subscription), count in folded.items():
        family.add_metric([address, subscription, OTHER_LINKS], count)
    return family


class HotMetrics(Collector):
    """The per-message counters and the delivery latency histogram, read at scrape time."""

    def collect(self) -> Iterable[CounterMetricFamily | HistogramMetricFamily]:
        counts: dict[tuple[str, ...], float] = {}
        for (what, *values), count in list(_COUNTS.items()):
            key = (what, *_folded(_HOT_COUNTERS[what][2], values))
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
            key = _folded(latency_labels, pair)
            if key in histograms:
                histograms[key] = [a + b for a, b in zip(histograms[key], histogram, strict=True)]
            else:
                histograms[key] = histogram
        latency = HistogramMetricFamily(LATENCY_NAME, LATENCY_HELP, labels=latency_labels)
        for (address, label), histogram in histograms.items():
            cumulative, buckets = 0.0, []
            for bound, in_bucket in zip((*LATENCY_BUCKETS, float('inf')), histogram, strict=False):
                cumulative += in_bucket
                buckets.append((floatToGoString(bound), cumulative))  # type: ignore[no-untyped-call]
            latency.add_metric([address, label], buckets, histogram[-1])
        yield latency
        yield _link_deliveries()


REGISTRY.register(HotMetrics())


Gauges = Callable[[], Iterable[tuple[str, str, list[str], list[tuple[list[str], float]]]]]
"""Yields (name, help, label names, [(label values, value), ...]) at scrape time."""


class ScrapeTimeGauges(Collector):
    """Gauges read from the broker's own state when Prometheus scrapes (never stale)."""

    def __init__(self, source: Gauges) -> None:
        self._source = source

    def collect(self) -> Iterable[GaugeMetricFamily]:
        for name, help_text, label_names, samples in self._source():
            family = GaugeMetricFamily(name, help_text, labels=label_names)
            totals: dict[tuple[str, ...], float] = {}
            for values, value in samples:
                key = _folded(label_names, values)
                totals[key] = totals.get(key, 0.0) + value
            for key, value in totals.items():
                family.add_metric(list(key), value)
            yield family


def register_gauges(source: Gauges) -> ScrapeTimeGauges:
    collector = ScrapeTimeGauges(source)
    REGISTRY.register(collector)
    return collector


# -- the door, limits and the store connection: events a user expects to count -------------------
# Not per message (these are refusals and failures), so plain prometheus_client counters. Every
# label takes its value from a closed set: a peer's input (a mechanism name it made up, a user
# name) never becomes a label value.

SASL_MECHANISMS = ('ANONYMOUS', 'PLAIN', 'EXTERNAL', 'SCRAM-SHA-256', 'SCRAM-SHA-512')
"""The mechanisms the broker can offer; any other name a peer asks for is counted as ``other``."""

AUTHENTICATION_FAILURES = Counter(
    'shoal_authentication_failures',
    'SASL exchanges that did not let the peer in, by mechanism (none: it never chose one) and '
    'reason (credentials, mechanism, malformed, protocol_header, timeout).',
    ['mechanism', 'reason'],
)
AUTHORIZATION_FAILURES = Counter(
    'shoal_authorization_failures',
    'Operations an authenticated user was refused for lack of permission, by operation.',
    ['operation'],
)
CONNECTIONS_REFUSED = Counter(
    'shoal_connections_refused',
    'Authenticated connections the broker refused at Open, by AMQP error condition.',
    ['condition'],
)
LINKS_REFUSED = Counter(
    'shoal_links_refused',
    'Attaches the broker refused, by role (consumer, producer) and AMQP error condition.',
    ['role', 'condition'],
)
PUBLISHES_REFUSED = Counter(
    'shoal_publishes_refused',
    'Messages refused to producers because storage is limited, by reason (redis_watermark, '
    'redis_full, address_limit).',
    ['reason'],
)
PRODUCERS_BLOCKED = 'shoal_producers_blocked'
PRODUCERS_BLOCKED_HELP = (
    'Producer links on this replica held back now, by reason (memory_ceiling: no credit while '
    'resident memory is over the ceiling; redis_watermark: every message refused while Redis is '
    'over its high watermark).'
)
REDIS_RECONNECTS = 'shoal_redis_reconnects'
REDIS_RECONNECTS_HELP = (
    "Times this replica's Redis connections were lost and opened again, by connection "
    '(pipeline: the message store path; notifications: the pub/sub channel).'
)
SENTINEL_SWITCHES = 'shoal_redis_sentinel_switches'
SENTINEL_SWITCHES_HELP = 'Redis Sentinel primary switches (failovers) this replica followed.'


def authentication_failed(mechanism: str | None, reason: str) -> None:
    label = 'none' if mechanism is None else mechanism if mechanism in SASL_MECHANISMS else 'other'
    AUTHENTICATION_FAILURES.labels(label, reason).inc()


def link_refused(sender: bool, condition: str) -> None:
    LINKS_REFUSED.labels('consumer' if sender else 'producer', condition).inc()


def publish_refused(error: BrokerError) -> None:
    """Counts a message refused because storage is limited (other refusals are not blocks)."""
    if isinstance(error, StoreFull):
        PUBLISHES_REFUSED.labels(error.reason).inc()


Counts = Callable[[], Iterable[tuple[str, str, list[str], list[tuple[list[str], float]]]]]
"""Yields (name without _total, help, label names, [(label values, count), ...]) at scrape time."""


class ScrapeTimeCounters(Collector):
    """Counters kept as plain ints by code that must not import prometheus_client (the store's
    modules are imported by the operator too), read when Prometheus scrapes."""

    def __init__(self, source: Counts) -> None:
        self._source = source

    def collect(self) -> Iterable[CounterMetricFamily]:
        for name, help_text, label_names, samples in self._source():
            family = CounterMetricFamily(name, help_text, labels=label_names)
            for values, value in samples:
                family.add_metric(values, value)
            yield family


def register_counters(source: Counts) -> ScrapeTimeCounters:
    collector = ScrapeTimeCounters(source)
    REGISTRY.register(collector)
    return collector
