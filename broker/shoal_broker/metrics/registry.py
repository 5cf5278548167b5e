"""
Every Prometheus metric the broker exports, named in one place (names follow Prometheus
conventions): the process-wide ones are defined here, the others by concern in ``hot`` (per
message), ``links`` (per consumer link), ``refusals`` (the door and limits) and ``scrape`` (read
from their owners at scrape time); ``labels`` keeps the label sets bounded.

Labels: ``address``; ``subscription`` is ``queue`` for a queue, the subscription id for a named
JMS subscription and ``private`` for a plain topic subscriber (its per-link group name would make
every consumer a new series). Only the first ``cap_address_series`` addresses get series of
their own; the rest are added up under ``address="_other"``, so a scrape stays bounded however
many addresses a client creates. ``link`` (``shoal_consumer_deliveries``) is a consumer link's
AMQP name, for at most ``cap_consumer_link_series`` attached links; the series of a link goes when
it detaches. Counting sits on the per-message path, so labelled children are
looked up once per address or subscription and cached (``Counters``), not per message.
"""

from prometheus_client import Counter, Gauge, Histogram

from shoal_broker.metrics.hot import (
    DELIVERY_LATENCY_BUCKETS,
    LATENCY_BUCKETS,
    LATENCY_HELP,
    LATENCY_NAME,
    Counters,
    address_seen,
    duplicates_dropped,
    entities_seen,
    subscription_seen,
    values_replaced,
)
from shoal_broker.metrics.labels import (
    OTHER_ADDRESSES,
    PRIVATE_LABEL,
    cap_address_series,
    subscription_label,
)
from shoal_broker.metrics.links import (
    LINK_DELIVERIES_HELP,
    LINK_DELIVERIES_NAME,
    OTHER_LINKS,
    LinkDeliveries,
    cap_consumer_link_series,
    link_attached,
    link_deliveries_family,
    link_detached,
)
from shoal_broker.metrics.refusals import (
    AUTHENTICATION_FAILURES,
    AUTHORIZATION_FAILURES,
    CONNECTIONS_REFUSED,
    HELD_SENDS_GIVEN_UP,
    LINKS_REFUSED,
    PUBLISHES_REFUSED,
    SASL_MECHANISMS,
    authentication_failed,
    link_refused,
    publish_refused,
    refusals_at_zero,
)
from shoal_broker.metrics.scrape import (
    Counts,
    Gauges,
    ScrapeTimeCounters,
    ScrapeTimeGauges,
    register_counters,
    register_gauges,
)

__all__ = [
    'AUTHENTICATION_FAILURES',
    'AUTHORIZATION_FAILURES',
    'BACKGROUND_FAILURES',
    'CONNECTIONS_REFUSED',
    'DELIVERY_LATENCY_BUCKETS',
    'HELD_SENDS_GIVEN_UP',
    'LATENCY_BUCKETS',
    'LATENCY_HELP',
    'LATENCY_NAME',
    'LEASE_UP',
    'LINKS_REFUSED',
    'LINK_DELIVERIES_HELP',
    'LINK_DELIVERIES_NAME',
    'LOOP_LAG',
    'OTHER_ADDRESSES',
    'OTHER_LINKS',
    'PRIVATE_LABEL',
    'PRODUCERS_BLOCKED',
    'PRODUCERS_BLOCKED_HELP',
    'PUBLISHES_REFUSED',
    'REDIS_RECONNECTS',
    'REDIS_RECONNECTS_HELP',
    'REDIS_ROUND_TRIP',
    'REDIS_UP',
    'SASL_MECHANISMS',
    'SENTINEL_SWITCHES',
    'SENTINEL_SWITCHES_HELP',
    'Counters',
    'Counts',
    'Gauges',
    'LinkDeliveries',
    'ScrapeTimeCounters',
    'ScrapeTimeGauges',
    'address_seen',
    'authentication_failed',
    'cap_address_series',
    'cap_consumer_link_series',
    'duplicates_dropped',
    'entities_seen',
    'link_attached',
    'link_deliveries_family',
    'link_detached',
    'link_refused',
    'publish_refused',
    'refusals_at_zero',
    'register_counters',
    'register_gauges',
    'subscription_label',
    'subscription_seen',
    'values_replaced',
]  # fmt: skip

REDIS_ROUND_TRIP = Histogram(
    'shoal_redis_pipeline_seconds',
    'Round trip of one batched Redis pipeline (the per-message store path).',
    buckets=LATENCY_BUCKETS,
)
LEASE_UP = Gauge('shoal_replica_lease_up', 'Whether this replica holds its liveness lease.')
MANAGEMENT_WRITES = Counter(
    'shoal_management_writes',
    'Writes through the management API (each also an audit log line), by operation and outcome '
    '(ok, refused, denied, failed).',
    ['operation', 'outcome'],
)

# message groups (amqp/groups.py)
ACTIVE_GROUPS = Gauge(
    'shoal_active_groups',
    'Message groups pinned to a consumer on this replica (owned in Redis by it): each goes to '
    'that consumer alone until it leaves or the group is idle.',
)
GROUP_MOVES = Counter(
    'shoal_group_moves',
    'Message groups moved off a consumer that left (detached, its connection dropped) on this '
    "replica; a dead replica's groups are let go by its reaper and counted nowhere.",
)

EXCLUSIVE_HANDOVERS = Counter(
    'shoal_exclusive_handovers',
    'Times the next consumer in line of an exclusive queue or subscription took over from the '
    'active one (it left, its connection dropped or its replica died), counted by the replica '
    'that moved the line.',
)

BACKGROUND_FAILURES = Counter(
    'shoal_background_task_failures',
    'Failed rounds of a background safety task (lease, store_memory, trim, policies, reaping).',
    ['task'],
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

PRODUCERS_BLOCKED = 'shoal_producers_blocked'
PRODUCERS_BLOCKED_HELP = (
    'Producer links on this replica held back now, by reason (memory_ceiling: no credit while '
    'resident memory is over the ceiling; redis_watermark: every message refused while Redis is '
    'over its high watermark; store_hold: no credit while sends are held through a store '
    'outage).'
)
REDIS_RECONNECTS = 'shoal_redis_reconnects'
REDIS_RECONNECTS_HELP = (
    "Times this replica's Redis connections were lost and opened again, by connection "
    '(pipeline: the message store path; notifications: the pub/sub channel).'
)
SENTINEL_SWITCHES = 'shoal_redis_sentinel_switches'
SENTINEL_SWITCHES_HELP = 'Redis Sentinel primary switches (failovers) this replica followed.'
