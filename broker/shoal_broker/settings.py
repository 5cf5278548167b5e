"""
Everything an operator of the broker can tune, with defaults and units.

Built once by ``cli.py`` (command-line options override environment variables, which override
the defaults here); everything else receives a ``BrokerSettings`` argument. The ``ENV_*`` names
are a contract with the Kubernetes operator, which renders them into the broker's pod.
"""

import dataclasses
import enum
import os
import socket
from collections.abc import Mapping

from shoal_broker.settings_duplicates import DuplicateSettings as DuplicateSettings
from shoal_broker.settings_duplicates import duplicates_from_env
from shoal_broker.settings_last_values import LastValueSettings as LastValueSettings
from shoal_broker.settings_last_values import last_values_from_env
from shoal_broker.settings_names import *  # the ENV_* names, re-exported
from shoal_broker.settings_names import env_flag, env_size


class AddressKind(enum.StrEnum):
    """How an address distributes messages; fixed when the address is created."""

    QUEUE = 'queue'
    """Anycast: each message goes to exactly one consumer."""
    TOPIC = 'topic'
    """Multicast: each subscription gets its own copy of every later message."""


class Durability(enum.StrEnum):
    """When a message counts as stored, so that it may be accepted (DESIGN.md §4)."""

    MEMORY = 'memory'
    """In Redis's memory. The embedded Redis appends to its AOF every second: a Redis crash
    loses up to the last second of accepted messages; a broker crash loses nothing."""
    FSYNC = 'fsync'
    """Written and fsynced to Redis's append-only file (``appendfsync always``) before the
    accept: a Redis or machine crash loses nothing accepted. An external Redis must be configured
    so (checked at start)."""
    REPLICATED = 'replicated'
    """Acknowledged by at least one Redis replica (``WAIT 1``) before the accept: losing the
    primary loses nothing accepted once a replica is promoted."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class AmqpSettings:
    listen: str = '127.0.0.1:5672'
    """``HOST:PORT`` of the AMQP acceptor. Pods set ``0.0.0.0:5672``."""

    idle_timeout_seconds: float = 60.0
    """A connection that sends no frame for this long is closed. Half of it is advertised in Open,
    so well-behaved peers heartbeat at a quarter of it. Applies only after Open: Qpid JMS may hold
    an authenticated transport without an Open for minutes."""

    max_frame_size: int = 1024 * 1024
    """Largest frame accepted or sent, in bytes (Qpid JMS asks for 1 MiB)."""

    max_message_size: int = 64 * 1024 * 1024
    """Largest message accepted, in bytes; larger ones close the link with
    ``amqp:link:message-size-exceeded`` and nothing is stored."""

    producer_credit: int = 1000
    """Link credit each producer link holds at most. Credit is returned only once messages are
    stored, so this bounds what a producer can have in flight."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoutingSettings:
    auto_create_queues: bool = True
    """Create a queue on first use (attach or anonymous-relay send), as Artemis does."""

    auto_create_topics: bool = True
    """Create a topic on first use."""

    default_address_kind: AddressKind = AddressKind.QUEUE
    """Kind given to an auto-created address when the peer states none (no ``queue``/``topic``
    capability and no ``x-opt-jms-dest`` annotation)."""

    max_delivery_attempts: int = 10
    """After this many failed deliveries (modified with delivery-failed) a message is
    dead-lettered. 0 means unlimited."""

    dead_letter_address: str = 'DLQ'
    """Queue that receives rejected messages and those past ``max_delivery_attempts``. Empty
    means such messages are dropped (and counted)."""

    expiry_address: str = ''
    """Queue that receives expired messages. Empty means expired messages are dropped (and
    counted)."""

    # a message a consumer gives back waits delay * multiplier ** (count - 1) ms, at most the
    # maximum (0: a day), before any consumer may have it again; 0: no wait (routing/redelivery)
    redelivery_delay_ms: int = 0
    redelivery_multiplier: float = 1.0
    max_redelivery_delay_ms: int = 0

    max_consumers_per_subscription: int = 0
    """Consumers a shared subscription may have across all replicas (0 = unlimited); more are
    refused with ``amqp:resource-limit-exceeded``. A provisioned subscription's own limit wins."""

    declared_subscriptions_only: bool = False
    """Refuse (``amqp:not-allowed``) attaches to shared subscriptions that no SharedSubscription
    resource declares, so the resources are the only way to create them."""

    handover: bool = True
    """Hand an at-most-once message to a waiting at-most-once consumer of the queue on the same
    replica without Redis (``LocalSubscription.take``). Off, every message goes through Redis and
    is spread over every replica's consumers."""

    handover_hold_seconds: float = 0.1
    """How long such a message may wait on its replica for a local consumer's credit before it
    goes to Redis (where any replica's consumers can take it, and a killed replica cannot lose
    it)."""

    deliver_ahead: bool = True
    """Send an at-least-once message to a waiting consumer of the queue on the same replica while
    Redis stores it, rather than after (``LocalSubscription.ahead``): Redis leaves the path from
    producer to consumer. The producer is still answered only once Redis has the message."""

    exclusive_addresses: tuple[str, ...] = ()
    """Shell-style patterns (comma-separated in SHOAL_EXCLUSIVE_ADDRESSES) of the addresses whose
    queue and subscriptions have a single active consumer (``routing/exclusive.py``), unless
    their Queue or SharedSubscription says otherwise."""

    def __post_init__(self) -> None:
        if min(self.redelivery_delay_ms, self.max_redelivery_delay_ms) < 0:
            raise ValueError('redelivery delays must be 0 ms or more')
        if not 1.0 <= self.redelivery_multiplier <= 100.0:
            raise ValueError(f'the redelivery multiplier must be within 1..100, not '
                             f'{self.redelivery_multiplier}')  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoreSettings:
    redis_url: str | None = None
    """Where all broker state lives. ``None`` starts an embedded ``redis-server`` child process
    with its data in ``data_dir``."""

    data_dir: str = '.data/redis'
    """Directory of the embedded Redis's append-only file. Ignored with ``redis_url``."""

    trim_interval_seconds: float = 5.0
    """How often streams are trimmed below the oldest entry any subscription needs (by the live
    replica with the smallest id, for all)."""

    durability: Durability = Durability.MEMORY
    """When a message is accepted: see ``Durability``."""

    replication_timeout_ms: int = 1000
    """With ``replicated`` durability: how long to wait for a Redis replica before releasing
    (not accepting) the messages written meanwhile."""

    metrics_interval_seconds: float = 10.0
    """How often each replica appends one metric record per queue and subscription to the
    metrics stream (the analytics job's input). 0 disables the records."""

    metrics_heartbeat_seconds: float = 30.0
    """How often a replica writes the record of a queue or subscription whose figures did not
    change (no activity, same backlog, same consumers here); a changed one is written at the next
    interval. At most half the analytics job's window (60 s), so every window holds a record of
    every entity; at most the interval means every interval, as before."""

    metrics_stream_length: int = 200_000
    """About how many metric records the metrics stream keeps (older ones are trimmed)."""

    backlog_refresh_seconds: float = 5.0
    """How often each replica reads every queue's and subscription's backlog and in-flight
    count from Redis for its gauges (one pipeline over the addresses)."""

    lease_seconds: float = 5.0
    """A replica that has not renewed its lease for this long is taken for dead: another replica
    returns its in-flight deliveries (within about this plus one second) and releases its
    consumers and ClientIDs. Renewed every third of it."""

    # -- sends held through a store outage (amqp/holding.py) --

    hold_seconds: float = 30.0
    """How long a producer's unsettled message waits for the store while it is unreachable,
    failing over or has not confirmed a write: the broker withholds new credit meanwhile and
    writes the held messages, in order, once the store answers again. Past this, a message is
    rejected with ``amqp:resource-limit-exceeded`` and a description (never released). 0 turns
    the hold off: a store failure releases the message at once, as before."""

    hold_max_bytes: int = 64 * 1024 * 1024
    """Bound on the bytes of messages held at once (their encoded sections); a message that
    would pass it is rejected at once like one held too long."""

    big_message_bytes: int = 32 * 1024
    """A message whose bytes after its header reach this keeps its body out of Redis's Lua
    scripts (``store/bodies.py``; docs/performance.md#big-bodies); 0: none does."""


class ClientAuth(enum.StrEnum):
    """Whether the TLS listener asks for a client certificate."""

    NONE = 'none'
    OPTIONAL = 'optional'
    """Asked for and verified when presented (then SASL EXTERNAL is offered)."""
    REQUIRED = 'required'
    """The TLS handshake fails without a certificate signed by the client CA."""


class Overflow(enum.StrEnum):
    """What a publish to an address at its backlog limit does."""

    REJECT_PUBLISH = 'reject-publish'
    """The message is rejected with ``amqp:resource-limit-exceeded``."""
    DROP_OLDEST = 'drop-oldest'
    """The message is stored and the address's oldest messages are dropped."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SecuritySettings:
    """Authentication, TLS and per-connection limits (docs/security.md)."""

    allow_anonymous: bool = True
    """Offer SASL ANONYMOUS (and accept peers that skip SASL). On for ``make run`` and the tests;
    the Helm chart turns it off."""

    users_file: str = ''
    """JSON users file (salted SCRAM keys and permissions; a Kubernetes Secret mount works),
    re-read when it changes. Empty: no users, so only ANONYMOUS can connect, unrestricted."""

    management_credentials_dir: str = ''
    """A directory holding files ``username`` and ``password`` (the operator's management
    Secret, mounted): one more user, with every permission, for the management API only (not
    AMQP); read at each request, so a rotated Secret applies at once. Empty: none."""

    sasl_timeout_seconds: float = 10.0
    """A connection that has not finished SASL (or sent its AMQP header) by then is dropped."""

    open_timeout_seconds: float = 300.0
    """A connection that has not sent Open by then is dropped (0 = never). Qpid JMS defers Open
    until the ClientID is known, so this is minutes, not seconds."""

    tls_listen: str = ''
    """``HOST:PORT`` of the ``amqps`` (TLS) acceptor; empty = none."""

    tls_cert_file: str = ''
    """PEM server certificate (chain) for the TLS acceptor; re-read when it changes or on SIGHUP."""

    tls_key_file: str = ''
    """PEM private key of ``tls_cert_file``."""

    tls_client_ca_file: str = ''
    """PEM CA bundle client certificates must chain to (needed unless client auth is ``none``)."""

    tls_client_auth: ClientAuth = ClientAuth.NONE

    tls_reload_interval_seconds: float = 10.0
    """How often the certificate, key and CA files are checked for changes."""

    redis_ca_file: str = ''
    """PEM CA bundle for a ``rediss://`` Redis URL (else the system's trust store)."""

    max_connections: int = 0
    """AMQP connections this replica holds at most (0 = unlimited); more are refused with
    ``amqp:resource-limit-exceeded`` in the Close."""

    max_connections_per_user: int = 0
    """Connections one user may hold on this replica (0 = unlimited)."""

    max_sessions_per_connection: int = 1000
    """Sessions a connection may have open; more are ended with ``amqp:resource-limit-exceeded``."""

    max_links_per_session: int = 1000
    """Links a session may have attached; more are refused with ``amqp:resource-limit-exceeded``."""

    max_subscriptions_per_topic: int = 0
    """Subscriptions (durable, shared or private) a topic may have (0 = unlimited); a consumer
    that would add one more is refused with ``amqp:resource-limit-exceeded``."""

    max_auto_created_addresses_per_user: int = 1000
    """Addresses one user may have this replica create on demand, by attaching to or sending to
    a name that does not exist yet (0 = unlimited); past it the attach or message is refused with
    ``amqp:resource-limit-exceeded``. Temporary queues and topics are not counted."""

    metrics_max_addresses: int = 1000
    """Addresses that get series of their own on ``/metrics``; the series of any further address
    are added up under ``address="_other"`` (0 = no cap), so the scrape stays bounded whatever
    the number of addresses."""

    metrics_max_consumer_links: int = 200
    """Attached consumer links that get a ``shoal_consumer_deliveries`` series of their own on
    ``/metrics``; further links count under ``link="_other"`` (0 = no cap). A link's series is
    dropped when it detaches, so clients that attach and detach over and over do not grow it."""

    max_failed_logins_per_minute: int = 30
    """Refused credentials (wrong password, unknown user) one source address may give per minute
    (0 = unlimited); past it that address's logins are answered with the sasl-outcome sys-temp,
    before any credential is read. An unoffered mechanism or a malformed response is not counted:
    it guesses nothing (docs/security.md#failed-login-throttle)."""

    max_backlog_per_address: int = 0
    """Messages an address may hold (0 = unlimited); see ``backlog_overflow``."""

    backlog_overflow: Overflow = Overflow.REJECT_PUBLISH

    memory_ceiling_mb: int = 0
    """Resident memory (MiB) above which producers get no more credit until it falls below 90 %
    of it (0 = no ceiling): back-pressure instead of an out-of-memory kill."""

    redis_memory_high_watermark: float = 0.9
    """With a Redis ``maxmemory``: once Redis uses this fraction of it, messages are refused
    with ``amqp:resource-limit-exceeded`` (sampled every 0.1 s), keeping the rest for the writes
    consumers need (returns, acks, leases). 0 = refuse only when Redis itself refuses (OOM)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TracingSettings:
    """Broker spans for messages that carry a W3C trace context (docs/tracing.md). Where the
    spans go is the standard ``OTEL_*`` environment's (``OTEL_EXPORTER_OTLP_ENDPOINT``,
    ``OTEL_SERVICE_NAME``, ``OTEL_BSP_*``), read by the OpenTelemetry SDK itself."""

    enabled: bool = False
    """Record spans; needs the ``tracing`` extra (opentelemetry-sdk and the OTLP/HTTP
    exporter). Off, the broker imports neither and checks one boolean per message."""

    sample_ratio: float = 1.0
    """Of the messages whose producer sampled its span (parent-based), the fraction the broker
    records, decided by trace id so that every replica decides alike for one message. Messages
    without a trace context or with an unsampled one get no broker span."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(
                f'the tracing sample ratio must be within 0..1, not {self.sample_ratio}'
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class BrokerSettings:
    amqp: AmqpSettings = dataclasses.field(default_factory=AmqpSettings)
    routing: RoutingSettings = dataclasses.field(default_factory=RoutingSettings)
    store: StoreSettings = dataclasses.field(default_factory=StoreSettings)
    security: SecuritySettings = dataclasses.field(default_factory=SecuritySettings)
    duplicates: DuplicateSettings = dataclasses.field(default_factory=DuplicateSettings)
    last_values: LastValueSettings = dataclasses.field(default_factory=LastValueSettings)
    tracing: TracingSettings = dataclasses.field(default_factory=TracingSettings)

    replica_id: str = dataclasses.field(
        default_factory=lambda: f'{socket.gethostname()}-{os.getpid()}'
    )
    """This process's name in Redis consumer groups and leases; unique per live replica."""

    http: str = '127.0.0.1:8080'
    """``HOST:PORT`` of the health and metrics endpoint (``/livez``, ``/readyz``, ``/metrics``).
    Empty disables it."""

    log_format: LogFormat = LogFormat.TEXT
    """``text`` for people, ``json`` (one object per line) for log collectors."""

    log_level: str = 'INFO'

    shutdown_grace_seconds: float = 10.0
    """On SIGTERM: how long to wait for in-flight store work before exiting anyway."""

    connection_drain_seconds: float = 2.0
    """On SIGTERM, before the rest: how long connections get to finish (``running/draining.py``)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> 'BrokerSettings':
        """Defaults, overridden by whichever ``SHOAL_*`` variables are set."""
        d = cls()
        return cls(
            amqp=AmqpSettings(
                listen=env.get(ENV_LISTEN, d.amqp.listen),
                idle_timeout_seconds=float(env.get(ENV_IDLE_TIMEOUT, d.amqp.idle_timeout_seconds)),
                max_frame_size=int(env.get(ENV_MAX_FRAME_SIZE, d.amqp.max_frame_size)),
                max_message_size=int(env.get(ENV_MAX_MESSAGE_SIZE, d.amqp.max_message_size)),
                producer_credit=int(env.get(ENV_PRODUCER_CREDIT, d.amqp.producer_credit)),
            ),
            routing=RoutingSettings(
                auto_create_queues=env_flag(
                    env, ENV_AUTO_CREATE_QUEUES, d.routing.auto_create_queues
                ),
                auto_create_topics=env_flag(
                    env, ENV_AUTO_CREATE_TOPICS, d.routing.auto_create_topics
                ),
                default_address_kind=AddressKind(
                    env.get(ENV_DEFAULT_ADDRESS_KIND, d.routing.default_address_kind)
                ),
                max_delivery_attempts=int(
                    env.get(ENV_MAX_DELIVERY_ATTEMPTS, d.routing.max_delivery_attempts)
                ),
                dead_letter_address=env.get(ENV_DEAD_LETTER_ADDRESS, d.routing.dead_letter_address),
                expiry_address=env.get(ENV_EXPIRY_ADDRESS, d.routing.expiry_address),
                redelivery_delay_ms=int(env.get(ENV_REDELIVERY_DELAY, '0')),
                redelivery_multiplier=float(env.get(ENV_REDELIVERY_MULTIPLIER, '1')),
                max_redelivery_delay_ms=int(env.get(ENV_MAX_REDELIVERY_DELAY, '0')),
                max_consumers_per_subscription=int(
                    env.get(ENV_MAX_CONSUMERS, d.routing.max_consumers_per_subscription)
                ),
                declared_subscriptions_only=env_flag(
                    env, ENV_DECLARED_SUBSCRIPTIONS_ONLY, d.routing.declared_subscriptions_only
                ),
                handover=env_flag(env, ENV_HANDOVER, d.routing.handover),
                deliver_ahead=env_flag(env, ENV_DELIVER_AHEAD, d.routing.deliver_ahead),
                handover_hold_seconds=float(
                    env.get(ENV_HANDOVER_HOLD, d.routing.handover_hold_seconds)
                ),
                exclusive_addresses=tuple(
                    p.strip()
                    for p in env.get(
                        ENV_EXCLUSIVE_ADDRESSES, ','.join(d.routing.exclusive_addresses)
                    ).split(',')
                    if p.strip()
                ),
            ),
            store=StoreSettings(
                redis_url=env.get(ENV_REDIS_URL) or None,
                data_dir=env.get(ENV_DATA_DIR, d.store.data_dir),
                trim_interval_seconds=float(
                    env.get(ENV_TRIM_INTERVAL, d.store.trim_interval_seconds)
                ),
                lease_seconds=float(env.get(ENV_LEASE, d.store.lease_seconds)),
                metrics_interval_seconds=float(
                    env.get(ENV_METRICS_INTERVAL, d.store.metrics_interval_seconds)
                ),
                metrics_stream_length=int(
                    env.get(ENV_METRICS_STREAM_LENGTH, d.store.metrics_stream_length)
                ),
                metrics_heartbeat_seconds=float(
                    env.get(ENV_METRICS_HEARTBEAT, d.store.metrics_heartbeat_seconds)
                ),
                backlog_refresh_seconds=float(
                    env.get(ENV_BACKLOG_REFRESH, d.store.backlog_refresh_seconds)
                ),
                durability=Durability(env.get(ENV_DURABILITY, d.store.durability)),
                replication_timeout_ms=int(
                    env.get(ENV_REPLICATION_TIMEOUT, d.store.replication_timeout_ms)
                ),
                # sends held through a store outage
                hold_seconds=float(env.get(ENV_STORE_HOLD, d.store.hold_seconds)),
                hold_max_bytes=int(env.get(ENV_STORE_HOLD_BYTES, d.store.hold_max_bytes)),
                big_message_bytes=env_size(env, ENV_BIG_MESSAGE, d.store.big_message_bytes),
            ),
            security=_security_from_env(env, d.security),
            duplicates=duplicates_from_env(env, d.duplicates),
            last_values=last_values_from_env(env, d.last_values),
            tracing=TracingSettings(
                enabled=env_flag(env, ENV_TRACING, d.tracing.enabled),
                sample_ratio=float(env.get(ENV_TRACING_SAMPLE_RATIO, d.tracing.sample_ratio)),
            ),
            replica_id=env.get(ENV_REPLICA_ID) or d.replica_id,
            http=env.get(ENV_HTTP, d.http),
            log_format=LogFormat(env.get(ENV_LOG_FORMAT, d.log_format)),
            log_level=env.get(ENV_LOG_LEVEL, d.log_level),
            shutdown_grace_seconds=float(env.get(ENV_SHUTDOWN_GRACE, d.shutdown_grace_seconds)),
            connection_drain_seconds=float(env.get(ENV_DRAIN, d.connection_drain_seconds)),
        )


def _security_from_env(env: Mapping[str, str], d: SecuritySettings) -> SecuritySettings:
    return SecuritySettings(
        allow_anonymous=env_flag(env, ENV_ALLOW_ANONYMOUS, d.allow_anonymous),
        users_file=env.get(ENV_USERS_FILE, d.users_file),
        management_credentials_dir=env.get(
            ENV_MANAGEMENT_CREDENTIALS_DIR, d.management_credentials_dir
        ),
        sasl_timeout_seconds=float(env.get(ENV_SASL_TIMEOUT, d.sasl_timeout_seconds)),
        open_timeout_seconds=float(env.get(ENV_OPEN_TIMEOUT, d.open_timeout_seconds)),
        tls_listen=env.get(ENV_TLS_LISTEN, d.tls_listen),
        tls_cert_file=env.get(ENV_TLS_CERT_FILE, d.tls_cert_file),
        tls_key_file=env.get(ENV_TLS_KEY_FILE, d.tls_key_file),
        tls_client_ca_file=env.get(ENV_TLS_CLIENT_CA_FILE, d.tls_client_ca_file),
        tls_client_auth=ClientAuth(env.get(ENV_TLS_CLIENT_AUTH, d.tls_client_auth)),
        tls_reload_interval_seconds=float(
            env.get(ENV_TLS_RELOAD_INTERVAL, d.tls_reload_interval_seconds)
        ),
        redis_ca_file=env.get(ENV_REDIS_CA_FILE, d.redis_ca_file),
        max_connections=int(env.get(ENV_MAX_CONNECTIONS, d.max_connections)),
        max_connections_per_user=int(
            env.get(ENV_MAX_CONNECTIONS_PER_USER, d.max_connections_per_user)
        ),
        max_sessions_per_connection=int(env.get(ENV_MAX_SESSIONS, d.max_sessions_per_connection)),
        max_links_per_session=int(env.get(ENV_MAX_LINKS, d.max_links_per_session)),
        max_subscriptions_per_topic=int(
            env.get(ENV_MAX_SUBSCRIPTIONS, d.max_subscriptions_per_topic)
        ),
        max_auto_created_addresses_per_user=int(
            env.get(ENV_MAX_AUTO_ADDRESSES, d.max_auto_created_addresses_per_user)
        ),
        metrics_max_addresses=int(env.get(ENV_METRICS_MAX_ADDRESSES, d.metrics_max_addresses)),
        metrics_max_consumer_links=int(
            env.get(ENV_METRICS_MAX_CONSUMER_LINKS, d.metrics_max_consumer_links)
        ),
        max_failed_logins_per_minute=int(
            env.get(ENV_LOGIN_FAILURES, d.max_failed_logins_per_minute)
        ),
        max_backlog_per_address=int(env.get(ENV_MAX_BACKLOG, d.max_backlog_per_address)),
        backlog_overflow=Overflow(env.get(ENV_BACKLOG_OVERFLOW, d.backlog_overflow)),
        memory_ceiling_mb=int(env.get(ENV_MEMORY_CEILING, d.memory_ceiling_mb)),
        redis_memory_high_watermark=float(
            env.get(ENV_REDIS_MEMORY_WATERMARK, d.redis_memory_high_watermark)
        ),
    )
