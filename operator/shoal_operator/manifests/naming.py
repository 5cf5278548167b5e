"""Child names and the standard labels every object of a BrokerCluster carries."""

from shoal_operator.models import BrokerCluster

AMQP_PORT = 5672
AMQPS_PORT = 5671
HTTP_PORT = 8080


def labels(cluster: BrokerCluster, component: str = 'broker') -> dict[str, str]:
    """Selector labels: stable for the cluster's life (a Deployment selector is immutable)."""
    return {
        'app.kubernetes.io/name': 'shoal',
        'app.kubernetes.io/instance': cluster.meta.name,
        'app.kubernetes.io/component': component,
    }


def all_labels(cluster: BrokerCluster, component: str = 'broker') -> dict[str, str]:
    return {**labels(cluster, component), 'app.kubernetes.io/managed-by': 'shoal-operator'}


def selector(cluster: BrokerCluster) -> str:
    """The label selector string the scale subresource reports (``status.selector``)."""
    return ','.join(f'{k}={v}' for k, v in labels(cluster).items())


def child(cluster: BrokerCluster, suffix: str = '') -> str:
    return f'{cluster.meta.name}-{suffix}' if suffix else cluster.meta.name


def redis_url_secret(cluster: BrokerCluster) -> str:
    """The Secret the operator renders the brokers' Redis URL into (key ``url``)."""
    return child(cluster, 'redis-url')


def management_secret(cluster: BrokerCluster) -> str:
    """The Secret with the management API's URL and the operator-made credentials for it."""
    return child(cluster, 'management')


def service_host(cluster: BrokerCluster) -> str:
    return f'{child(cluster)}.{cluster.meta.namespace}.svc'


def metadata(cluster: BrokerCluster, name: str, component: str = 'broker') -> dict[str, object]:
    return {'name': name, 'namespace': cluster.meta.namespace,
            'labels': all_labels(cluster, component)}  # fmt: skip
