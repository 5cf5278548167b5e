"""
Typed, validated views of the three custom resources, parsed from their bodies.

The CRD schema (``crds/``) defaults and validates fields on a real API server; this module applies
the same defaults again so the operator behaves the same against a server that does not (kmock,
or a CR stored before a default was added), and raises ``InvalidSpec`` for what the schema cannot
express. Everything else in the operator works on these dataclasses, never on raw bodies.
"""

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from shoal_broker.routing.policies import NO_POLICY, EntityPolicy
from shoal_broker.settings import Overflow
from shoal_operator.autoscaling import Autoscaling
from shoal_operator.duplicates import duplicate_fields
from shoal_operator.invalid import InvalidSpec as InvalidSpec
from shoal_operator.invalid import bounded
from shoal_operator.last_value import last_value_fields
from shoal_operator.redelivery import redelivery_fields

GROUP = 'shoal.dev'
VERSION = 'v1alpha1'
API_VERSION = f'{GROUP}/{VERSION}'
PAUSE_ANNOTATION = f'{GROUP}/paused'
FORCE_DELETE_ANNOTATION = f'{GROUP}/force-delete'


def describe(body: Mapping[str, Any]) -> str:
    """``<namespace>/<name>`` of a raw body, for logs."""
    meta = body.get('metadata') or {}
    return f'{meta.get("namespace")}/{meta.get("name")}'


class DeletionPolicy(enum.StrEnum):
    RETAIN = 'Retain'
    DELETE = 'Delete'
    DELETE_IF_EMPTY = 'DeleteIfEmpty'


class ManagementPolicy(enum.StrEnum):
    MANAGED = 'Managed'
    OBSERVE_ONLY = 'ObserveOnly'


@dataclasses.dataclass(frozen=True, slots=True)
class Meta:
    """What every resource carries: identity, generation and the operator's annotations."""

    namespace: str
    name: str
    uid: str
    generation: int
    annotations: Mapping[str, str]

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> 'Meta':
        meta = body.get('metadata') or {}
        return cls(
            namespace=str(meta.get('namespace') or 'default'),
            name=str(meta.get('name') or ''),
            uid=str(meta.get('uid') or ''),
            generation=int(meta.get('generation') or 1),
            annotations=dict(meta.get('annotations') or {}),
        )

    @property
    def paused(self) -> bool:
        return self.annotations.get(PAUSE_ANNOTATION, '').lower() == 'true'

    @property
    def force_delete(self) -> bool:
        return self.annotations.get(FORCE_DELETE_ANNOTATION, '').lower() == 'true'

    @property
    def owner(self) -> str:
        """How Redis names the declaring resource: ``<namespace>/<name>``."""
        return f'{self.namespace}/{self.name}'


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterRef:
    namespace: str
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Auth:
    """``spec.auth``: secure by default, SASL users from a Secret and no ANONYMOUS."""

    allow_anonymous: bool = False
    users_secret: str | None = None

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> 'Auth':
        auth = spec.get('auth') or {}
        found = cls(
            allow_anonymous=bool(auth.get('allowAnonymous', False)),
            users_secret=str(auth['usersSecretName']) if auth.get('usersSecretName') else None,
        )
        if not found.allow_anonymous and found.users_secret is None:
            raise InvalidSpec(
                'auth.usersSecretName is required unless auth.allowAnonymous is true '
                '(a cluster without users and without ANONYMOUS accepts no client)'
            )
        return found


class ClientAuth(enum.StrEnum):
    NONE = 'None'
    OPTIONAL = 'Optional'
    REQUIRED = 'Required'


@dataclasses.dataclass(frozen=True, slots=True)
class Tls:
    """``spec.tls``: the AMQPS listener's certificate and, optionally, client certificates."""

    secret: str
    client_auth: ClientAuth = ClientAuth.NONE
    client_ca_secret: str | None = None

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> 'Tls | None':
        tls = spec.get('tls')
        if tls is None:
            return None
        if not tls.get('secretName'):
            raise InvalidSpec('tls.secretName is required')
        try:
            client_auth = ClientAuth(tls.get('clientAuth', 'None'))
        except ValueError:
            raise InvalidSpec('tls.clientAuth must be None, Optional or Required') from None
        ca = str(tls['clientCASecretName']) if tls.get('clientCASecretName') else None
        if client_auth is not ClientAuth.NONE and ca is None:
            raise InvalidSpec(
                'tls.clientCASecretName is required when tls.clientAuth is Optional or Required'
            )
        return cls(secret=str(tls['secretName']), client_auth=client_auth, client_ca_secret=ca)


class RedisMode(enum.StrEnum):
    STANDALONE = 'standalone'
    SENTINEL = 'sentinel'
    CLUSTER = 'cluster'


@dataclasses.dataclass(frozen=True, slots=True)
class Credentials:
    """A Secret holding a user name (optional) and a password, by key."""

    secret: str
    password_key: str = 'password'
    username_key: str | None = None

    @classmethod
    def of(cls, section: Mapping[str, Any] | None, field: str) -> 'Credentials | None':
        if section is None:
            return None
        if not section.get('secretName'):
            raise InvalidSpec(f'{field}.secretName is required')
        username = section.get('usernameKey')
        return cls(secret=str(section['secretName']),
                   password_key=str(section.get('passwordKey') or 'password'),
                   username_key=str(username) if username else None)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class RedisSpec:
    """``spec.redis``: a Secret holding the whole URL (``url_secret``), or the mode and where the
    servers are, from which the operator renders the URL (``shoal_operator.redisurl``)."""

    mode: RedisMode | None = None
    """As written; None leaves it to the URL (or standalone for ``host``)."""
    url_secret: str | None = None
    url_key: str = 'url'
    hosts: tuple[str, ...] = ()
    """``host[:port]`` of the standalone server, the sentinels or the cluster's seed nodes."""
    service: str = ''
    """The name the sentinels monitor the primary under."""
    db: int = 0
    auth: Credentials | None = None
    sentinel_auth: Credentials | None = None
    tls: bool = False
    ca_secret: str | None = None

    @property
    def rendered(self) -> bool:
        """Whether the operator renders the URL (rather than reading it from ``url_secret``)."""
        return self.url_secret is None

    @property
    def effective_mode(self) -> RedisMode:
        return self.mode or RedisMode.STANDALONE

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> 'RedisSpec':
        """The CRD's rules again (a server without them, or a resource stored before them)."""
        redis = spec.get('redis') or {}
        try:
            mode = RedisMode(redis['mode']) if redis.get('mode') else None
        except ValueError:
            raise InvalidSpec('spec.redis.mode must be standalone, sentinel or cluster') from None
        sentinel, cluster, host = redis.get('sentinel'), redis.get('cluster'), redis.get('host')
        if bool(redis.get('secretName')) == bool(host or sentinel or cluster):
            raise InvalidSpec('name Redis either by spec.redis.secretName (a Secret holding its '
                              'URL) or by host, sentinel or cluster')  # fmt: skip
        if redis.get('secretName'):
            if any(k in redis for k in ('auth', 'tls', 'db', 'port')):
                raise InvalidSpec('with spec.redis.secretName the URL carries the credentials, '
                                  'the db and TLS')  # fmt: skip
            return cls(mode=mode, url_secret=str(redis['secretName']),
                       url_key=str(redis.get('key') or 'url'))  # fmt: skip
        if 'port' in redis and not host:
            raise InvalidSpec('spec.redis.port goes with host')
        hosts, service, sentinel_auth = _servers(redis, mode)
        tls = redis.get('tls')
        return cls(
            mode=mode, hosts=hosts, service=service, db=int(redis.get('db') or 0),
            auth=Credentials.of(redis.get('auth'), 'spec.redis.auth'),
            sentinel_auth=sentinel_auth, tls=tls is not None,
            ca_secret=str(tls['caSecretName']) if tls and tls.get('caSecretName') else None,
        )  # fmt: skip


def _servers(
    redis: Mapping[str, Any], mode: RedisMode | None
) -> tuple[tuple[str, ...], str, Credentials | None]:
    """(``host[:port]`` of each server, the sentinels' service name, their credentials)."""
    host, sentinel, cluster = redis.get('host'), redis.get('sentinel'), redis.get('cluster')
    if host:
        if mode not in (None, RedisMode.STANDALONE):
            raise InvalidSpec("spec.redis.host is the standalone mode's field")
        port = redis.get('port')
        return (f'{host}:{int(port)}' if port else str(host),), '', None
    if sentinel:
        if mode is not RedisMode.SENTINEL:
            raise InvalidSpec('spec.redis.sentinel needs mode sentinel')
        hosts = tuple(str(h) for h in sentinel.get('hosts') or ())
        service = str(sentinel.get('serviceName') or '')
        if not hosts or not service:
            raise InvalidSpec('spec.redis.sentinel needs hosts and serviceName')
        return hosts, service, Credentials.of(sentinel.get('auth'), 'spec.redis.sentinel.auth')
    if mode is not RedisMode.CLUSTER:
        raise InvalidSpec('spec.redis.cluster needs mode cluster')
    nodes = tuple(str(h) for h in (cluster or {}).get('nodes') or ())
    if not nodes:
        raise InvalidSpec('spec.redis.cluster needs nodes')
    if redis.get('db'):
        raise InvalidSpec('Redis Cluster has only db 0')
    return nodes, '', None


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerCluster:
    meta: Meta
    replicas: int
    image: str
    image_pull_policy: str
    redis: RedisSpec
    durability: str
    broker_settings: Mapping[str, Any]
    service_type: str
    service_annotations: Mapping[str, str]
    resources: Mapping[str, Any]
    pod_template: Mapping[str, Any]
    pdb_max_unavailable: int
    drain_seconds: int
    """``spec.scaleDown.drainSeconds``: the preStop wait, while Services stop routing to the pod."""
    shutdown_grace_seconds: int
    connection_drain_seconds: int | None
    """``spec.scaleDown.connectionDrainSeconds`` (SHOAL_CONNECTION_DRAIN_SECONDS), None when
    unset: the brokers' default, inside ``shutdown_grace_seconds``."""
    service_monitor: Mapping[str, Any] | None
    """``{'interval': ..., 'labels': {...}}`` when enabled."""
    network_policy_from: list[Any] | None
    """Allowed peers when the NetworkPolicy is enabled (empty: every pod of the namespace)."""
    finalizer_timeout_seconds: int
    allowed_namespaces: frozenset[str]
    autoscaling: Autoscaling
    auth: Auth
    tls: Tls | None
    """The AMQPS listener, when ``spec.tls`` is set."""
    declared_subscriptions_only: bool = False
    """``spec.subscriptions.undeclared: Deny``."""

    @property
    def termination_grace_seconds(self) -> int:
        """The pod's grace period: the preStop wait, the connections' drain when set apart from
        the shutdown grace, the shutdown grace, and 5 s to spare."""
        drain = self.connection_drain_seconds or 0
        return self.drain_seconds + drain + self.shutdown_grace_seconds + 5

    @classmethod
    def from_body(cls, body: Mapping[str, Any], *, default_image: str) -> 'BrokerCluster':
        spec = body.get('spec') or {}
        image = spec.get('image') or default_image
        monitor = (spec.get('metrics') or {}).get('serviceMonitor') or {}
        policy = spec.get('networkPolicy') or {}
        scale_down = spec.get('scaleDown') or {}
        try:
            autoscaling = Autoscaling.of(spec)
        except ValueError as exc:
            raise InvalidSpec(str(exc)) from None
        service = spec.get('service') or {}
        return cls(
            meta=Meta.of(body),
            replicas=int(spec.get('replicas', 2)),
            image=image,
            image_pull_policy=str(spec.get('imagePullPolicy', 'IfNotPresent')),
            redis=RedisSpec.of(spec),
            durability=str(spec.get('durability', 'memory')),
            broker_settings=dict(spec.get('broker') or {}),
            service_type=str(service.get('type', 'ClusterIP')),
            service_annotations=dict(service.get('annotations') or {}),
            resources=dict(spec.get('resources') or {}),
            pod_template=dict(spec.get('podTemplate') or {}),
            pdb_max_unavailable=int((spec.get('pdb') or {}).get('maxUnavailable', 1)),
            drain_seconds=int(scale_down.get('drainSeconds', 5)),
            shutdown_grace_seconds=int(scale_down.get('shutdownGraceSeconds', 20)),
            connection_drain_seconds=(
                int(scale_down['connectionDrainSeconds'])
                if scale_down.get('connectionDrainSeconds') is not None
                else None
            ),
            service_monitor=(
                {'interval': monitor.get('interval', '30s'), 'labels': monitor.get('labels') or {}}
                if monitor.get('enabled')
                else None
            ),
            network_policy_from=list(policy.get('from') or []) if policy.get('enabled') else None,
            finalizer_timeout_seconds=int(spec.get('finalizerTimeoutSeconds', 600)),
            allowed_namespaces=frozenset(
                (spec.get('tenancy') or {}).get('allowedNamespaces') or ()
            ),
            autoscaling=autoscaling,
            declared_subscriptions_only=(
                (spec.get('subscriptions') or {}).get('undeclared', 'Allow') == 'Deny'
            ),
            auth=Auth.of(spec),
            tls=Tls.of(spec),
        )

    def admits(self, namespace: str) -> bool:
        """Whether resources in ``namespace`` may reference this cluster."""
        return namespace == self.meta.namespace or namespace in self.allowed_namespaces


def _cluster_ref(meta: Meta, spec: Mapping[str, Any]) -> ClusterRef:
    ref = spec.get('clusterRef') or {}
    if not ref.get('name'):
        raise InvalidSpec('spec.clusterRef.name is required')
    return ClusterRef(namespace=str(ref.get('namespace') or meta.namespace), name=str(ref['name']))


_OVERFLOW = {'RejectPublish': Overflow.REJECT_PUBLISH, 'DropOldest': Overflow.DROP_OLDEST}


def _policy(spec: Mapping[str, Any], *, queue: bool, topic: str | None = None) -> EntityPolicy:
    """``delivery{}``, ``retention{}`` and ``duplicateDetection{}`` in the broker's vocabulary
    (the CRD bounds again); a subscription's duplicate detection names its ``topic``."""
    delivery = spec.get('delivery') or {}
    retention = spec.get('retention') or {}
    dla = delivery.get('deadLetterAddress')
    if dla is not None and (not str(dla) or any(c.isspace() for c in str(dla))):
        raise InvalidSpec(f'deadLetterAddress {dla!r} must be non-empty without whitespace')
    max_messages = bounded(retention, 'maxMessages', 1, 100_000_000) if queue else None
    overflow = retention.get('overflow', 'RejectPublish') if queue else 'RejectPublish'
    if overflow not in _OVERFLOW:
        raise InvalidSpec(f'overflow must be RejectPublish or DropOldest, not {overflow!r}')
    if 'overflow' in retention and queue and max_messages is None:
        raise InvalidSpec('overflow needs maxMessages')
    try:
        redelivery = redelivery_fields(delivery)
    except ValueError as exc:
        raise InvalidSpec(str(exc)) from None
    if (exclusive := delivery.get('exclusive')) is not None and not isinstance(exclusive, bool):
        raise InvalidSpec(f'exclusive must be true or false, not {exclusive!r}')
    rebalance = delivery.get('groupRebalance')
    if rebalance is not None and not isinstance(rebalance, bool):
        raise InvalidSpec(f'groupRebalance must be true or false, not {rebalance!r}')
    return EntityPolicy(
        max_delivery_attempts=bounded(delivery, 'maxDeliveryAttempts', 1, 1000),
        dead_letter_address=str(dla) if dla is not None else None,
        max_age_seconds=bounded(retention, 'maxAgeSeconds', 1, 31_536_000),
        max_messages=max_messages,
        overflow=_OVERFLOW[overflow],
        **duplicate_fields(spec.get('duplicateDetection'), topic),
        **redelivery,
        **(last_value_fields(spec.get('lastValue')) if queue else {}),
        exclusive=exclusive,
        group_rebalance=rebalance,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Queue:
    meta: Meta
    cluster: ClusterRef
    address: str
    deletion_policy: DeletionPolicy
    management_policy: ManagementPolicy
    policy: EntityPolicy = NO_POLICY
    """``delivery{}`` and ``retention{}`` (empty: the broker-wide settings apply)."""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> 'Queue':
        meta = Meta.of(body)
        spec = body.get('spec') or {}
        address = str(spec.get('queueName') or meta.name)
        if not address or any(c.isspace() for c in address):
            raise InvalidSpec(f'queue name {address!r} must be non-empty without whitespace')
        return cls(
            meta=meta,
            cluster=_cluster_ref(meta, spec),
            address=address,
            deletion_policy=DeletionPolicy(spec.get('deletionPolicy', 'Retain')),
            management_policy=ManagementPolicy(spec.get('managementPolicy', 'Managed')),
            policy=_policy(spec, queue=True),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class SharedSubscription:
    meta: Meta
    cluster: ClusterRef
    topic: str
    subscription_name: str
    durable: bool
    client_id: str | None
    """The owning JMS ClientID (scope ClientId); None for a global subscription."""
    selector: str | None
    recreate_on_change: bool
    max_consumers: int | None
    deletion_policy: DeletionPolicy
    management_policy: ManagementPolicy
    policy: EntityPolicy = NO_POLICY
    """``delivery{}`` and ``retention{maxAgeSeconds}`` (empty: the broker-wide settings apply)."""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> 'SharedSubscription':
        meta = Meta.of(body)
        spec = body.get('spec') or {}
        name = str(spec.get('subscriptionName') or '')
        if not name or '|' in name or any(c.isspace() for c in name):
            raise InvalidSpec(f'subscriptionName {name!r} must be non-empty, without | or spaces')
        topic = str(spec.get('topic') or '')
        if not topic:
            raise InvalidSpec('spec.topic is required')
        scope = spec.get('scope', 'Global')
        client_id = spec.get('clientId')
        if (scope == 'ClientId') != bool(client_id):
            raise InvalidSpec('clientId is required when scope=ClientId and forbidden otherwise')
        durable = bool(spec.get('durable', True))
        deletion = DeletionPolicy(spec.get('deletionPolicy', 'Retain'))
        if not durable and deletion is not DeletionPolicy.DELETE:
            raise InvalidSpec('non-durable subscriptions can only use deletionPolicy=Delete')
        max_consumers = spec.get('maxConsumers')
        if (spec.get('delivery') or {}).get('exclusive') is True and max_consumers == 1:
            raise InvalidSpec('an exclusive subscription needs maxConsumers of at least 2 or none')
        return cls(
            meta=meta,
            cluster=_cluster_ref(meta, spec),
            topic=topic,
            subscription_name=name,
            durable=durable,
            client_id=str(client_id) if client_id else None,
            selector=str(spec['selector']).strip() or None if spec.get('selector') else None,
            recreate_on_change=spec.get('selectorChangePolicy', 'Reject') == 'Recreate',
            max_consumers=int(max_consumers) if max_consumers is not None else None,
            deletion_policy=deletion,
            management_policy=ManagementPolicy(spec.get('managementPolicy', 'Managed')),
            policy=_policy(spec, queue=False, topic=topic),
        )

    @property
    def link_name(self) -> str:
        """The base link name Qpid JMS gives a consumer of this subscription."""
        return self.subscription_name if self.client_id else f'{self.subscription_name}|global'
