"""How clients reach the brokers: the AMQP Service, a headless Service, a NetworkPolicy."""

from shoal_operator.manifests import naming, security
from shoal_operator.manifests.config import Manifest
from shoal_operator.models import BrokerCluster


def service(cluster: BrokerCluster) -> Manifest:
    meta = naming.metadata(cluster, naming.child(cluster))
    if cluster.service_annotations:
        meta['annotations'] = dict(cluster.service_annotations)
    return {
        'apiVersion': 'v1',
        'kind': 'Service',
        'metadata': meta,
        'spec': {
            'type': cluster.service_type,
            'selector': naming.labels(cluster),
            'ports': [
                {'name': 'amqp', 'port': naming.AMQP_PORT, 'targetPort': 'amqp', 'protocol': 'TCP'},
                {'name': 'http', 'port': naming.HTTP_PORT, 'targetPort': 'http', 'protocol': 'TCP'},
                *security.service_ports(cluster),
            ],
        },
    }


def headless_service(cluster: BrokerCluster) -> Manifest:
    """Every replica's address (for metrics scraping and per-pod debugging)."""
    return {
        'apiVersion': 'v1',
        'kind': 'Service',
        'metadata': naming.metadata(cluster, naming.child(cluster, 'pods')),
        'spec': {
            # no ``publishNotReadyAddresses: false``: the API server drops a false there
            # (omitempty), so the object would never seem to hold it and every drift check
            # would patch it again
            'clusterIP': 'None',
            'selector': naming.labels(cluster),
            'ports': [
                {'name': 'amqp', 'port': naming.AMQP_PORT, 'targetPort': 'amqp', 'protocol': 'TCP'},
                {'name': 'http', 'port': naming.HTTP_PORT, 'targetPort': 'http', 'protocol': 'TCP'},
                *security.service_ports(cluster),
            ],
        },
    }


def network_policy(cluster: BrokerCluster) -> Manifest | None:
    """AMQP (and AMQPS) only from the allowed peers (default: pods of the namespace); HTTP
    (probes, metrics) from anywhere in the cluster network."""
    if cluster.network_policy_from is None:
        return None
    peers = cluster.network_policy_from or [{'podSelector': {}}]
    return {
        'apiVersion': 'networking.k8s.io/v1',
        'kind': 'NetworkPolicy',
        'metadata': naming.metadata(cluster, naming.child(cluster)),
        'spec': {
            'podSelector': {'matchLabels': naming.labels(cluster)},
            'policyTypes': ['Ingress'],
            'ingress': [
                {
                    'from': peers,
                    'ports': [
                        {'protocol': 'TCP', 'port': port}
                        for port in security.client_ports(cluster).values()
                    ],
                },
                {'ports': [{'protocol': 'TCP', 'port': naming.HTTP_PORT}]},
            ],
        },
    }


def service_monitor(cluster: BrokerCluster) -> Manifest | None:
    if cluster.service_monitor is None:
        return None
    meta = naming.metadata(cluster, naming.child(cluster))
    meta['labels'] = {**dict(cluster.service_monitor['labels']), **naming.all_labels(cluster)}
    return {
        'apiVersion': 'monitoring.coreos.com/v1',
        'kind': 'ServiceMonitor',
        'metadata': meta,
        'spec': {
            'selector': {'matchLabels': naming.labels(cluster)},
            'endpoints': [{'port': 'http', 'path': '/metrics',
                           'interval': cluster.service_monitor['interval']}],
        },
    }  # fmt: skip
