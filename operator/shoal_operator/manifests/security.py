"""
Who may connect to the broker pods: the SASL users file and the AMQPS listener's certificates.

Both come from Secrets mounted as whole directories, read-only: a Secret volume is updated in
place (never with ``subPath``, which would freeze it), and the broker re-reads the users file and
reloads the certificates when they change, so rotating a Secret needs no restart. The settings
are container environment variables rather than ConfigMap entries so that turning them on or off
changes the pod template and rolls the Deployment.
"""

from typing import Any

from shoal_broker import settings as broker
from shoal_operator.manifests import naming
from shoal_operator.models import BrokerCluster, ClientAuth

USERS_DIR = '/etc/shoal/users'
USERS_FILE = f'{USERS_DIR}/users.json'
TLS_DIR = '/etc/shoal/tls'
CLIENT_CA_DIR = '/etc/shoal/client-ca'
READ_ONLY_FOR_GROUP = 0o440
"""Secret files are readable by the broker through the pod's fsGroup, by no one else."""

_CLIENT_AUTH = {
    ClientAuth.NONE: broker.ClientAuth.NONE,
    ClientAuth.OPTIONAL: broker.ClientAuth.OPTIONAL,
    ClientAuth.REQUIRED: broker.ClientAuth.REQUIRED,
}


def _secret_volume(volume: str, secret: str, keys: list[str]) -> dict[str, Any]:
    return {
        'name': volume,
        'secret': {
            'secretName': secret,
            'items': [{'key': key, 'path': key} for key in keys],
            'defaultMode': READ_ONLY_FOR_GROUP,
        },
    }


def _mounts(cluster: BrokerCluster) -> list[tuple[dict[str, Any], str]]:
    """(volume, mount path) pairs of the Secrets the cluster's spec names."""
    found = []
    if cluster.auth.users_secret is not None:
        found.append(
            (_secret_volume('users', cluster.auth.users_secret, ['users.json']), USERS_DIR)
        )
    if cluster.tls is not None:
        found.append((_secret_volume('tls', cluster.tls.secret, ['tls.crt', 'tls.key']), TLS_DIR))
        if cluster.tls.client_ca_secret is not None:
            ca = _secret_volume('client-ca', cluster.tls.client_ca_secret, ['ca.crt'])
            found.append((ca, CLIENT_CA_DIR))
    return found


def volumes(cluster: BrokerCluster) -> list[dict[str, Any]]:
    return [volume for volume, _ in _mounts(cluster)]


def volume_mounts(cluster: BrokerCluster) -> list[dict[str, Any]]:
    return [{'name': volume['name'], 'mountPath': path, 'readOnly': True}
            for volume, path in _mounts(cluster)]  # fmt: skip


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
