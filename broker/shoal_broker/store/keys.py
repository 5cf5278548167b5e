"""
Every Redis key the broker touches, in one place.

An address's keys share the hash tag ``{a:<address>}`` so a script may touch all of them on Redis
Cluster: all keys of one script live in one slot and are passed in KEYS, never built inside the
script. Global keys (``ADDRESSES``, ``SUBSCRIPTION_INDEX``, ``REPLICAS``, ...) are indexes, each
touched alone (docs/redis-modes.md, "The key layout"; ``layout.py``).

Layout (DESIGN.md §4): every address is a stream per priority band (one per JMS priority, band
``9 - priority``); every subscription is a
consumer group on those streams (a queue has exactly one, named ``routing.storage.QUEUE_GROUP``);
the broker replicas are the consumers of each group. This module imports nothing of the broker,
so the analytics job reads the metric stream's key without the broker's semantics.
"""

import dataclasses
import functools

PREFIX = 'shoal'

BANDS = 10
"""Streams per address, one per JMS priority (``routing.storage.BANDS``; this module imports
nothing of the broker)."""

ADDRESS_KEYS_CACHED = 4096
"""Addresses whose ``AddressKeys`` are kept made (~2 KB each)."""

ADDRESSES = f'{PREFIX}:addresses'
"""HASH address -> ``<kind>:<epoch>``: the index of addresses, written outside the scripts
(``layout.py``); an address's own record is ``AddressKeys.meta``. An older version wrote the bare
kind here, which a replica lays out at start."""

SUBSCRIPTIONS = f'{PREFIX}:subscriptions'
"""SET of named subscription ids written by an older version's scripts; laid out into
``SUBSCRIPTION_INDEX`` at start and deleted once no older replica is left (``layout.py``)."""

CLIENTS = f'{PREFIX}:clients'
"""HASH ClientID (container-id) -> ``<replica>|<connection>`` holding it, cluster-wide."""

METRICS = f'{PREFIX}:metrics'
"""STREAM of metric records (``metrics/records.py``), bounded; read by the analytics job."""

BACKLOGS = f'{PREFIX}:backlogs'
"""STRING (JSON, expires) the backlog of every queue and subscription, as one replica last read it
for all (``running/backlog.py``): the others read this one key instead of walking every stream."""

ANALYTICS_SUMMARY = f'{PREFIX}:analytics:summary'
"""HASH the analytics job replaces after each analysis and the operator reads: ``v`` (schema),
``summary`` (``metrics.records.AnalyticsSummary`` as JSON)."""

SCHEDULED = f'{PREFIX}:scheduled'
"""SET of addresses that have (or had) messages waiting for their delivery time."""

REPLICAS = f'{PREFIX}:replicas'
"""SET of replica ids that joined and have not been reaped: the ones whose leases are watched."""

RECLAIMED = 'reclaimed'
"""Consumer name holding a dead replica's entries until a live replica fetches them again."""


def lease(replica_id: str) -> str:
    """The older layout's lease (``ReplicaKeys.lease`` is the one renew_lease.lua takes): still
    renewed on standalone and Sentinel, for an older replica's reaper during a rolling
    upgrade."""
    return f'{PREFIX}:lease:{replica_id}'


def replica_channel(replica_id: str) -> str:
    """Pub/sub channel of one replica: subscribed at start so that the notification connection
    exists before any address is watched."""
    return f'{PREFIX}:__replica__:{replica_id}'


_NOTIFY_HEAD = f'{PREFIX}:{{a:'.encode()
_NOTIFY_TAIL = b'}:notify'


def notified_address(channel: bytes) -> str | None:
    """The address whose ``AddressKeys.notify`` channel this is; None for any other channel."""
    if channel.startswith(_NOTIFY_HEAD) and channel.endswith(_NOTIFY_TAIL):
        return channel[len(_NOTIFY_HEAD) : -len(_NOTIFY_TAIL)].decode()
    return None


def reaping(replica_id: str) -> str:
    """The older layout's reaping lock (``ReplicaKeys.reaping`` is the one taken now)."""
    return f'{PREFIX}:reaping:{replica_id}'


__all__ = [
    'ADDRESSES',
    'ANALYTICS_SUMMARY',
    'BANDS',
    'CLIENTS',
    'COMMIT_BUCKETS',
    'PAUSED',
    'RECLAIMED',
    'REPLICAS',
    'SCHEDULED',
    'SUBSCRIPTIONS',
    'SUBSCRIPTION_INDEX',
    'AddressKeys',
    'ReplicaKeys',
    'SubscriptionKeys',
    'commit_index',
    'commit_record',
    'entry_field',
    'entry_member',
    'lease',
    'notified_address',
    'reaping',
    'replica_channel',
    'replica_connections',
    'replica_control',
]  # fmt: skip


def address_tag(address: str) -> str:
    """The prefix of every key of ``address`` (``AddressKeys.tag``), made without the rest of
    its keys; itself never a key."""
    return f'{PREFIX}:{{a:{address}}}'


def probed_keys(address: str, band: int, groups: list[str]) -> tuple[str, list[str]]:
    """The STREAM of ``address``'s ``band`` (the default one), and the keys whose existence says
    the address holds more than that band (its levels SET, body index and ``groups``' returned
    ZSETs), as ``AddressKeys`` names them but made from the tag alone: the backlog walk probes
    every idle address, and going through ``AddressKeys.of`` would evict the cached keys of the
    addresses in use once more than ``ADDRESS_KEYS_CACHED`` are idle."""
    tag = address_tag(address)
    others = [_levels(tag), _body_index(tag), *(_returned(tag, group) for group in groups)]
    return _stream(tag, band), others


def _stream(tag: str, band: int) -> str:
    return f'{tag}:p:{band}'


def _levels(tag: str) -> str:
    return f'{tag}:levels'


def _body_index(tag: str) -> str:
    return f'{tag}:bodies'


def _returned(tag: str, group: str) -> str:
    return f'{tag}:ret:{group}'


@dataclasses.dataclass(frozen=True, slots=True)
class AddressKeys:
    streams: tuple[str, ...]
    """STREAM per band, indexed by band: band ``9 - priority`` (0: JMS priority 9, served
    first; 5: priority 4, the default). Fields: h header, r rest, x expiry, c origin."""
    groups: str
    """SET of subscription (consumer group) names on this address."""
    notify: str
    """Pub/sub channel: entries were added or returned."""
    tag: str

    @classmethod
    @functools.lru_cache(maxsize=ADDRESS_KEYS_CACHED)
    def of(cls, address: str) -> 'AddressKeys':
        """The keys of an address, made once for the most recent addresses: every store op
        asks, and ten stream names cost ~7 µs to build."""
        tag = address_tag(address)
        return cls(
            streams=tuple(_stream(tag, band) for band in range(BANDS)),
            groups=f'{tag}:groups',
            notify=f'{tag}:notify',
            tag=tag,
        )

    def body(self, stub_id: str) -> str:
        """STRING: a big message's bytes after its header (``store/bodies.py``), written beside
        the publish script rather than through it."""
        return f'{self.tag}:body:{stub_id}'

    @property
    def body_index(self) -> str:
        """ZSET of the big messages' entries, ``'<band>|<padded id>|<stub id>'`` (score 0): a
        trim finds the bodies of the entries it removed there (``lua/bodies_due.lua``)."""
        return _body_index(self.tag)

    @property
    def levels(self) -> str:
        """SET of the bands other than the default one (priority 4) that were written and not
        trimmed empty since: the bands a fetch reads besides the default one (``fetch.lua``),
        so an address used at one priority costs no read per empty band."""
        return _levels(self.tag)

    @property
    def two_bands(self) -> tuple[str, str]:
        """The older layout's two STREAMs (priorities 0-4, then 5-9), moved forward into
        ``streams`` at start (``layout.py``, ``lua/relayout_bands.lua``)."""
        return (f'{self.tag}:s:0', f'{self.tag}:s:1')

    @property
    def scheduled(self) -> str:
        """ZSET member -> delivery time (ms): messages held for a later delivery time."""
        return f'{self.tag}:sched'

    @property
    def scheduled_messages(self) -> str:
        """HASH member -> packed message, for the members of ``scheduled``."""
        return f'{self.tag}:sched:msg'

    @property
    def watchers(self) -> str:
        """HASH replica id -> 1: replicas subscribed to ``notify`` (they have consumers of the
        address). A publish wakes others only when someone other than itself is listed."""
        return f'{self.tag}:watchers'

    def returned(self, group: str) -> str:
        """ZSET (all scores 0, ordered by member) ``<band>|<padded id>`` of returned entries."""
        return _returned(self.tag, group)

    def shares(self, group: str) -> str:
        """HASH replica id -> its record in the sharing of the group between replicas
        (``routing/sharing.py``, ``lua/share.lua``): consumers, free credit, reserved entries,
        round-robin counter, last fetch and reservation times (ms)."""
        return f'{self.tag}:share:{group}'

    def line(self, group: str) -> str:
        """ZSET ``<replica>|<connection>|<link>|<serial>`` -> attach time (µs): the consumers of
        an exclusive queue or subscription in attach order; the first receives, the others
        stand by (``routing/exclusive.py``, ``lua/exclusive_*.lua``)."""
        return f'{self.tag}:line:{group}'

    def delivered(self, group: str) -> str:
        """HASH replica id -> messages it delivered for the group since the group exists, added
        from each replica's metric records (``Upkeep.append_records``): the per-replica
        share the CLI and the operator show."""
        return f'{self.tag}:delivered:{group}'

    def delivery_counts(self, group: str) -> str:
        """HASH ``<band>|<id>`` -> failed delivery attempts, for entries with at least one."""
        return f'{self.tag}:dc:{group}'

    def group_owners(self, group: str) -> str:
        """HASH message group (properties.group-id) -> the replica owning it in the subscription
        ``group`` (docs/architecture.md, "Message groups"; ``lua/fetch.lua``). Exists only once
        the subscription has seen a grouped message: the mark a fetch checks first."""
        return f'{self.tag}:gown:{group}'

    def group_parked(self, group: str) -> str:
        """ZSET (all scores 0) ``<replica>|<band>|<padded id>``: entries another replica read
        whose group the replica named owns, claimed for it (XCLAIM) and waiting for its fetch,
        which takes them in member order with its returned entries."""
        return f'{self.tag}:gpark:{group}'

    def group_held(self, group: str) -> str:
        """ZSET (all scores 0) ``<replica>|<message group>``: the groups each replica owns, so its
        leaving or reaping drops them in one call (``lua/groups_drop.lua``)."""
        return f'{self.tag}:gheld:{group}'

    @property
    def meta(self) -> str:
        """HASH ``kind`` (``queue``/``topic``) and ``epoch`` (a token new with each creation):
        the address's own record on its slot, for Redis Cluster, where ``ADDRESSES`` becomes an
        index outside every script (docs/redis-modes.md, "The key layout")."""
        return f'{self.tag}:meta'

    @property
    def commit_markers(self) -> str:
        """HASH commit record key -> 1: cross-shard commits already applied to this address, so
        that completing a commit again applies nothing twice (docs/redis-modes.md)."""
        return f'{self.tag}:txns'

    @property
    def imports(self) -> str:
        """HASH ``<source address>|<band>|<entry id>`` -> id of the copy: messages a management
        move or retry copied here and has not yet removed from their source, so that running
        it again after a crash copies none twice (``lua/manage_copy.lua``)."""
        return f'{self.tag}:imports'

    @property
    def duplicates(self) -> str:
        """ZSET message id (``amqp/duplicate_ids.py``) -> ms when stored: the duplicate window of
        an address with duplicate detection (``lua/duplicate_window.lua``), at most its window's
        count of ids, none older than its window's time."""
        return f'{self.tag}:dups'

    @property
    def last_values(self) -> str:
        """HASH key value (``amqp/duplicate_ids.py``'s typed form) -> ``<band>|<padded entry
        id>`` of its newest entry: a last-value queue's replacements (``lua/publish_last.lua``),
        one field per key value the queue has not read past (swept by each publish)."""
        return f'{self.tag}:lv'

    @property
    def last_value_order(self) -> str:
        """ZSET (scores 0) ``<band>|<padded entry id>|<key value>``, one member per field of
        ``last_values``, in entry order: what a publish finds the group has read past."""
        return f'{self.tag}:lv:order'

    def transaction_marker(self, transaction_id: str) -> str:
        """STRING with a short lifetime, written by a one-slot commit's ``MULTI``: whether that
        ``EXEC`` ran, when its reply was lost (``store/transactions.py``)."""
        return f'{self.tag}:txn:{transaction_id}'


def entry_member(band: int, entry_id: str) -> str:
    """Sortable member for the returned-entries ZSET: oldest entry first within a band."""
    ms, _, seq = entry_id.partition('-')
    return f'{band}|{int(ms):015d}-{int(seq or 0):010d}'


def entry_field(band: int, entry_id: str) -> str:
    """Field name of an entry in per-group hashes."""
    return f'{band}|{entry_id}'


@dataclasses.dataclass(frozen=True, slots=True)
class SubscriptionKeys:
    """The registry of one named subscription; its messages are a consumer group on the topic."""

    definition: str
    """HASH topic, selector, no_local, shared, durable, scope, client, name, max_consumers."""
    consumers: str
    """HASH consumer (``<replica>|<connection>|<link>``) -> replica id, across all replicas."""

    @classmethod
    def of(cls, subscription_id: str) -> 'SubscriptionKeys':
        tag = f'{PREFIX}:{{s:{subscription_id}}}'
        return cls(definition=f'{tag}:def', consumers=f'{tag}:consumers')


# -- provisioned definitions (store/registry.py; written by the operator) -------------------------

PROVISIONED = f'{PREFIX}:provisioned'
"""HASH entity (``queue:<address>``, ``subscription:<id>``) -> ``<namespace>/<name>`` of the
Kubernetes resource declaring it: the index of what the operator owns (a subscription's definition
HASH also carries the owner in its ``owner`` field, where the broker's scripts see it)."""


POLICIES = f'{PREFIX}:policies'
"""HASH entity (the same fields as ``PROVISIONED``) -> JSON ``routing.policies.EntityPolicy`` of a
declared queue or subscription with a delivery or retention policy; replicas read it every few
seconds (``running.chores.POLICY_REFRESH_SECONDS``)."""

DELETION_POLICIES = f'{PREFIX}:deletion-policies'
"""HASH entity (the same fields as ``PROVISIONED``) -> ``deletionPolicy`` of the declaring resource
(``Retain``, ``Delete``, ``DeleteIfEmpty``): what the operator carries out when it finds a
declaration whose resource is gone, also one deleted while no operator ran (none: ``Retain``)."""


PAUSED = f'{PREFIX}:paused'
"""HASH entity (the same fields as ``PROVISIONED``) -> JSON ``{"by": user, "at": ms}``: queues and
subscriptions whose delivery the management API paused; every replica reads it with the
policies and fetches nothing for a paused one (``management/control.py``)."""


def replica_connections(replica_id: str) -> str:
    """STRING (JSON, expires): the replica's client connections as it last listed them for the
    management API, so that any replica answers for all (``management/control.py``)."""
    return f'{PREFIX}:{{r:{replica_id}}}:connections'


def replica_control(replica_id: str) -> str:
    """LIST of commands for one replica from the management API of any replica (``close
    <connection>``, ``refresh``), popped by the replica every second."""
    return f'{PREFIX}:{{r:{replica_id}}}:control'


def provisioned_queue(address: str) -> str:
    """Field of ``PROVISIONED`` for a declared queue."""
    return f'queue:{address}'


def provisioned_subscription(subscription_id: str) -> str:
    """Field of ``PROVISIONED`` for a declared subscription."""
    return f'subscription:{subscription_id}'


# -- Redis Cluster layout (docs/redis-modes.md#the-key-layout) ------------------------------------

SUBSCRIPTION_INDEX = f'{PREFIX}:subscription-index'
"""HASH subscription id -> epoch of its definition: the index of named subscriptions on Redis
Cluster, written outside the scripts (before a creation, forgotten after a deletion only while
it still names the deleted epoch); it replaces the ``SUBSCRIPTIONS`` SET those scripts wrote."""

COMMIT_BUCKETS = 16
"""Slots a replica's cross-shard commit records are spread over (``commit_record``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaKeys:
    """A replica's liveness on one slot, so that ``renew_lease.lua`` touches one slot."""

    lease: str
    """STRING with a TTL: the replica is alive while it exists (value: its process token)."""
    reaping: str
    """STRING with a TTL: one live replica is cleaning up after this one."""
    joined: str
    """STRING: the replica joined and has not been reaped (``REPLICAS`` is its index)."""

    @classmethod
    def of(cls, replica_id: str) -> 'ReplicaKeys':
        tag = f'{PREFIX}:{{r:{replica_id}}}'
        return cls(lease=f'{tag}:lease', reaping=f'{tag}:reaping', joined=f'{tag}:joined')


def commit_bucket_tag(replica_id: str, bucket: int) -> str:
    return f'{PREFIX}:{{r:{replica_id}:{bucket}}}'


def commit_record(replica_id: str, bucket: int, commit_id: str) -> str:
    """HASH: a decided cross-shard commit of the replica, until every address has applied it."""
    return f'{commit_bucket_tag(replica_id, bucket)}:commit:{commit_id}'


def commit_index(replica_id: str, bucket: int) -> str:
    """SET of the replica's commit records in one bucket: what its reaper completes."""
    return f'{commit_bucket_tag(replica_id, bucket)}:commits'
