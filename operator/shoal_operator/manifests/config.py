"""The broker settings ConfigMap, the Redis URL Secret the brokers read and the connection Secret
apps mount."""

import base64
import dataclasses
import hashlib
import json
from typing import Any

from shoal_broker import settings as broker
from shoal_operator.manifests import naming
from shoal_operator.models import BrokerCluster

Manifest = dict[str, Any]

_SETTINGS = {
    'autoCreateQueues': broker.ENV_AUTO_CREATE_QUEUES,
    'autoCreateTopics': broker.ENV_AUTO_CREATE_TOPICS,
    'maxDeliveryAttempts': broker.ENV_MAX_DELIVERY_ATTEMPTS,
    'deadLetterAddress': broker.ENV_DEAD_LETTER_ADDRESS,
    'redeliveryDelay': broker.ENV_REDELIVERY_DELAY,
    'redeliveryMultiplier': broker.ENV_REDELIVERY_MULTIPLIER,
    'maxRedeliveryDelay': broker.ENV_MAX_REDELIVERY_DELAY,
    'maxConsumersPerSubscription': broker.ENV_MAX_CONSUMERS,
    'handover': broker.ENV_HANDOVER,
    'deliverAhead': broker.ENV_DELIVER_AHEAD,
    'exclusiveAddresses': broker.ENV_EXCLUSIVE_ADDRESSES,
    'idleTimeoutSeconds': broker.ENV_IDLE_TIMEOUT,
    'metricsIntervalSeconds': broker.ENV_METRICS_INTERVAL,
    'metricsHeartbeatSeconds': broker.ENV_METRICS_HEARTBEAT,
    'logLevel': broker.ENV_LOG_LEVEL,
    # duplicate detection
    'duplicateDetection': broker.ENV_DUPLICATE_DETECTION,
    'duplicateWindow': broker.ENV_DUPLICATE_WINDOW,
    'duplicateWindowSeconds': broker.ENV_DUPLICATE_WINDOW_SECONDS,
    'duplicateIdProperty': broker.ENV_DUPLICATE_ID_PROPERTY,
    # last-value queues
    'lastValueAddresses': broker.ENV_LAST_VALUE_ADDRESSES,
    'lastValueProperty': broker.ENV_LAST_VALUE_PROPERTY,
    # sends held through a store outage
    'storeHoldSeconds': broker.ENV_STORE_HOLD,
}
"""BrokerCluster ``spec.broker`` field -> the broker's environment variable."""
_TRACING = {
    'enabled': broker.ENV_TRACING,
    'sampleRatio': broker.ENV_TRACING_SAMPLE_RATIO,
    'otlpEndpoint': 'OTEL_EXPORTER_OTLP_ENDPOINT',  # the OpenTelemetry SDK's own variable
}
"""``spec.broker.tracing`` field -> the broker's environment variable."""
CONFIG_CHECKSUM = 'shoal.dev/config-checksum'
"""Pod-template annotation: the digest of the settings ConfigMap's data."""
REDIS_CHECKSUM = 'shoal.dev/redis-checksum'
"""Pod-template annotation: the digest of a rendered ``spec.redis`` (mode, hosts, Secret names)."""
REDIS_URL_KEY = 'url'


def _text(value: Any) -> str:
    if isinstance(value, list):  # patterns: comma-separated
        return ','.join(str(item) for item in value)
    return ('true' if value else 'false') if isinstance(value, bool) else str(value)


def settings_env(cluster: BrokerCluster) -> dict[str, str]:
    env = {
        broker.ENV_LISTEN: f'0.0.0.0:{naming.AMQP_PORT}',
        broker.ENV_HTTP: f'0.0.0.0:{naming.HTTP_PORT}',
        broker.ENV_DURABILITY: cluster.durability,
        broker.ENV_LOG_FORMAT: 'json',
        broker.ENV_SHUTDOWN_GRACE: str(cluster.shutdown_grace_seconds),
    }
    if cluster.connection_drain_seconds is not None:  # unset: the ConfigMap of earlier releases
        env[broker.ENV_DRAIN] = str(cluster.connection_drain_seconds)
    if cluster.declared_subscriptions_only:
        env[broker.ENV_DECLARED_SUBSCRIPTIONS_ONLY] = 'true'
    for field, variable in _SETTINGS.items():
        if field in cluster.broker_settings:
            env[variable] = _text(cluster.broker_settings[field])
    tracing = cluster.broker_settings.get('tracing') or {}
    for field, variable in _TRACING.items():
        if field in tracing:
            env[variable] = _text(tracing[field])
    return env


def configmap(cluster: BrokerCluster) -> Manifest:
    return {
        'apiVersion': 'v1',
        'kind': 'ConfigMap',
        'metadata': naming.metadata(cluster, naming.child(cluster, 'config')),
        'data': settings_env(cluster),
    }


def config_checksum(cluster: BrokerCluster) -> str:
    """The digest of what the settings ConfigMap holds. Brokers read their settings when they
    start, so the Deployment carries this in its pod template: a settings change changes the
    template and rolls the pods (within the rollout strategy and the PDB), and anything else
    leaves it alone. Keys are sorted, so the digest depends only on the settings."""
    canonical = json.dumps(settings_env(cluster), sort_keys=True, separators=(',', ':'))
    return hashlib.sha256(canonical.encode()).hexdigest()


def redis_checksum(cluster: BrokerCluster) -> str | None:
    """The digest of ``spec.redis`` when the operator renders its URL, None when the URL is the
    user's Secret (as before rendering existed, so such a cluster's pods are not rolled). The
    brokers read the URL when they start: a change of mode, hosts or Secret names rolls them. A
    password changed in its Secret reaches the rendered Secret on the next pass, and the brokers
    when they restart, as with a URL Secret."""
    if not cluster.redis.rendered:
        return None
    canonical = json.dumps(dataclasses.asdict(cluster.redis), sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def redis_url_source(cluster: BrokerCluster) -> dict[str, str]:
    """The secretKeyRef the brokers read SHOAL_REDIS_URL from."""
    if cluster.redis.url_secret is not None:
        return {'name': cluster.redis.url_secret, 'key': cluster.redis.url_key}
    return {'name': naming.redis_url_secret(cluster), 'key': REDIS_URL_KEY}


def redis_url_secret(cluster: BrokerCluster, url: str) -> Manifest:
    """The rendered URL, credentials included, for the broker pods (``redisurl.render``)."""
    return {
        'apiVersion': 'v1',
        'kind': 'Secret',
        'type': 'Opaque',
        'metadata': naming.metadata(cluster, naming.redis_url_secret(cluster)),
        'data': {REDIS_URL_KEY: _b64(url)},
    }


def connection_secret(cluster: BrokerCluster) -> Manifest:
    """Service Binding-style connection details (type, host, port, uri; amqps-port and amqps-uri
    with TLS) for apps."""
    return {
        'apiVersion': 'v1',
        'kind': 'Secret',
        'type': 'servicebinding.io/amqp',
        'metadata': naming.metadata(cluster, naming.child(cluster, 'connection')),
        'data': {key: _b64(value) for key, value in connection_details(cluster).items()},
    }


MANAGEMENT_USER = 'shoal-admin'
"""The user of the management Secret: every permission, on the management API only."""


def management_uri(cluster: BrokerCluster) -> str:
    return f'http://{naming.service_host(cluster)}:{naming.HTTP_PORT}/api'


def management_secret(cluster: BrokerCluster, password: str) -> Manifest:
    """The management API's URL and credentials for operators and tools; the broker pods mount
    it too (``SHOAL_MANAGEMENT_CREDENTIALS_DIR``) and accept this user on the API. The
    password is made once and kept (``clusters.apply_cluster``)."""
    data = {'uri': management_uri(cluster), 'username': MANAGEMENT_USER, 'password': password}
    return {
        'apiVersion': 'v1',
        'kind': 'Secret',
        'type': 'kubernetes.io/basic-auth',
        'metadata': naming.metadata(cluster, naming.management_secret(cluster)),
        'data': {key: _b64(value) for key, value in data.items()},
    }


def connection_details(cluster: BrokerCluster) -> dict[str, str]:
    host = naming.service_host(cluster)
    details = {
        'type': 'amqp',
        'provider': 'shoal',
        'host': host,
        'port': str(naming.AMQP_PORT),
        'uri': f'amqp://{host}:{naming.AMQP_PORT}',
        'management-uri': management_uri(cluster),
    }
    if cluster.tls is not None:
        details['amqps-port'] = str(naming.AMQPS_PORT)
        details['amqps-uri'] = f'amqps://{host}:{naming.AMQPS_PORT}'
    return details


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
