"""
Who may connect to the broker pods (the SASL users file and the AMQPS listener's certificates), and
the CA the brokers check their Redis servers against.

Both come from Secrets mounted as whole directories, read-only: a Secret volume is updated in
place (never with ``subPath``, which would freeze it), and the broker re-reads the users file and
reloads the certificates when they change, so rotating a Secret needs no restart. The settings
are container environment variables rather than ConfigMap entries so that turning them on or off
changes the pod template and rolls the Deployment.
"""

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from shoal_broker import settings as broker
from shoal_operator.manifests import naming
from shoal_operator.models import BrokerCluster, ClientAuth

USERS_DIR = '/etc/shoal/users'
USERS_FILE = f'{USERS_DIR}/users.json'
TLS_DIR = '/etc/shoal/tls'
CLIENT_CA_DIR = '/etc/shoal/client-ca'
REDIS_CA_DIR = '/etc/shoal/redis-ca'
REDIS_CA_FILE = f'{REDIS_CA_DIR}/ca.crt'
"""Where the broker pods find the CA of ``spec.redis.tls.caSecretName`` (the rendered URL's
``ssl_ca_certs``)."""
READ_ONLY_FOR_GROUP = 0o440
"""Secret files are readable by the broker through the pod's fsGroup, by no one else."""

_CLIENT_AUTH = {
    ClientAuth.NONE: broker.ClientAuth.NONE,
    ClientAuth.OPTIONAL: broker.ClientAuth.OPTIONAL,
    ClientAuth.REQUIRED: broker.ClientAuth.REQUIRED,
}


@dataclasses.dataclass(frozen=True, slots=True)
class SecretMount:
    """A Secret the broker pods mount: where the spec names it, the keys they read, where."""

    volume: str
    field: str
    secret: str
    keys: tuple[str, ...]
    path: str


def secret_mounts(cluster: BrokerCluster) -> list[SecretMount]:
    """The Secrets the cluster's spec names, which its pods cannot start without."""
    auth, tls = cluster.auth, cluster.tls
    found = []
    if auth.users_secret is not None:
        users = ('users.json',)
        found.append(SecretMount('users', 'spec.auth.usersSecretName', auth.users_secret, users,
                                 USERS_DIR))  # fmt: skip
    if tls is not None:
        pair = ('tls.crt', 'tls.key')
        found.append(SecretMount('tls', 'spec.tls.secretName', tls.secret, pair, TLS_DIR))
        if tls.client_ca_secret is not None:
            found.append(SecretMount('client-ca', 'spec.tls.clientCASecretName',
                                     tls.client_ca_secret, ('ca.crt',), CLIENT_CA_DIR))  # fmt: skip
    if cluster.redis.ca_secret is not None:
        found.append(SecretMount('redis-ca', 'spec.redis.tls.caSecretName', cluster.redis.ca_secret,
                                 ('ca.crt',), REDIS_CA_DIR))  # fmt: skip
    return found


def volumes(cluster: BrokerCluster) -> list[dict[str, Any]]:
    return [{
        'name': mount.volume,
        'secret': {
            'secretName': mount.secret,
            'items': [{'key': key, 'path': key} for key in mount.keys],
            'defaultMode': READ_ONLY_FOR_GROUP,
        },
    } for mount in secret_mounts(cluster)]  # fmt: skip


def volume_mounts(cluster: BrokerCluster) -> list[dict[str, Any]]:
    return [{'name': mount.volume, 'mountPath': mount.path, 'readOnly': True}
            for mount in secret_mounts(cluster)]  # fmt: skip


def secret_problems(
    cluster: BrokerCluster, found: Mapping[str, Collection[str] | None]
) -> list[tuple[str, str]]:
    """(reason, message) for each mounted Secret that is missing or lacks a key the pods read;
    ``found`` maps a Secret's name to its keys, or to None when it does not exist."""
    problems = []
    namespace = cluster.meta.namespace
    for mount in secret_mounts(cluster):
        keys = found.get(mount.secret)
        if keys is None:
            problems.append(('SecretMissing', f'Secret {namespace}/{mount.secret} '
                             f'({mount.field}) does not exist'))  # fmt: skip
            continue
        if missing := [key for key in mount.keys if key not in keys]:
            problems.append(('SecretKeyMissing', f'Secret {namespace}/{mount.secret} '
                             f'({mount.field}) has no key {", ".join(missing)}'))  # fmt: skip
    return problems


def env(cluster: BrokerCluster) -> list[dict[str, str]]:
    values = {broker.ENV_ALLOW_ANONYMOUS: 'true' if cluster.auth.allow_anonymous else 'false'}
    if cluster.auth.users_secret is not None:
        values[broker.ENV_USERS_FILE] = USERS_FILE
    if cluster.tls is not None:
        values[broker.ENV_TLS_LISTEN] = f'0.0.0.0:{naming.AMQPS_PORT}'
        values[broker.ENV_TLS_CERT_FILE] = f'{TLS_DIR}/tls.crt'
        values[broker.ENV_TLS_KEY_FILE] = f'{TLS_DIR}/tls.key'
        values[broker.ENV_TLS_CLIENT_AUTH] = _CLIENT_AUTH[cluster.tls.client_auth].value
        if cluster.tls.client_ca_secret is not None:
            values[broker.ENV_TLS_CLIENT_CA_FILE] = f'{CLIENT_CA_DIR}/ca.crt'
    return [{'name': name, 'value': value} for name, value in values.items()]


def container_ports(cluster: BrokerCluster) -> list[dict[str, Any]]:
    if cluster.tls is None:
        return []
    return [{'name': 'amqps', 'containerPort': naming.AMQPS_PORT, 'protocol': 'TCP'}]


def service_ports(cluster: BrokerCluster) -> list[dict[str, Any]]:
    if cluster.tls is None:
        return []
    return [{'name': 'amqps', 'port': naming.AMQPS_PORT, 'targetPort': 'amqps', 'protocol': 'TCP'}]


def client_ports(cluster: BrokerCluster) -> dict[str, int]:
    """The ports clients connect to, by URL scheme: AMQP, and AMQPS when the cluster has TLS."""
    found = {'amqp': naming.AMQP_PORT}
    if cluster.tls is not None:
        found['amqps'] = naming.AMQPS_PORT
    return found
