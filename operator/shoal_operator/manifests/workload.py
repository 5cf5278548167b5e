"""The broker pods: a Deployment (replicas hold no state; it is all in Redis) and its PDB."""

from typing import Any

from shoal_broker import settings as broker
from shoal_operator.manifests import config, naming, security
from shoal_operator.manifests.config import Manifest
from shoal_operator.models import BrokerCluster

BROKER_UID = 10001
MANAGEMENT_DIR = '/etc/shoal/management'
"""Where the pods mount the management Secret (optional: the pods start before it exists)."""
DEFAULT_RESOURCES = {'requests': {'cpu': '100m', 'memory': '256Mi'}, 'limits': {'memory': '1Gi'}}


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        'httpGet': {'path': path, 'port': 'http'},
        'periodSeconds': period,
        'timeoutSeconds': 2,
        'failureThreshold': failures,
    }


def _container(cluster: BrokerCluster) -> dict[str, Any]:
    return {
        'name': 'broker',
        'image': cluster.image,
        'imagePullPolicy': cluster.image_pull_policy,
        'command': ['shoal-broker'],
        'ports': [
            {'name': 'amqp', 'containerPort': naming.AMQP_PORT, 'protocol': 'TCP'},
            {'name': 'http', 'containerPort': naming.HTTP_PORT, 'protocol': 'TCP'},
            *security.container_ports(cluster),
        ],
        'envFrom': [{'configMapRef': {'name': naming.child(cluster, 'config')}}],
        'env': [
            {
                'name': broker.ENV_REDIS_URL,
                'valueFrom': {'secretKeyRef': config.redis_url_source(cluster)},
            },
            {
                'name': broker.ENV_REPLICA_ID,
                'valueFrom': {'fieldRef': {'fieldPath': 'metadata.name'}},
            },
            {'name': broker.ENV_MANAGEMENT_CREDENTIALS_DIR, 'value': MANAGEMENT_DIR},
            *security.env(cluster),
        ],
        'resources': cluster.resources or DEFAULT_RESOURCES,
        'startupProbe': _probe('/livez', 2, 30),
        'livenessProbe': _probe('/livez', 10, 3),
        'readinessProbe': _probe('/readyz', 5, 2),
        # preStop: the pod leaves the Service endpoints first (a terminating pod is taken out of
        # them whatever its probe says); then SIGTERM turns /readyz to 503, and the broker drains
        # and closes connections with amqp:connection:forced so clients fail over
        'lifecycle': {'preStop': {'exec': {'command': ['sleep', str(cluster.drain_seconds)]}}},
        'securityContext': {
            'runAsNonRoot': True,
            'runAsUser': BROKER_UID,
            'runAsGroup': BROKER_UID,
            'allowPrivilegeEscalation': False,
            'readOnlyRootFilesystem': True,
            'capabilities': {'drop': ['ALL']},
            'seccompProfile': {'type': 'RuntimeDefault'},
        },
        'volumeMounts': [
            {'name': 'tmp', 'mountPath': '/tmp'},
            {'name': 'management', 'mountPath': MANAGEMENT_DIR, 'readOnly': True},
            *security.volume_mounts(cluster),
        ],
    }


def _spreading(cluster: BrokerCluster) -> dict[str, Any]:
    selector = {'matchLabels': naming.labels(cluster)}
    template = cluster.pod_template
    return {
        'affinity': template.get('affinity') or {'podAntiAffinity': {
            'preferredDuringSchedulingIgnoredDuringExecution': [{
                'weight': 100,
                'podAffinityTerm': {'topologyKey': 'kubernetes.io/hostname',
                                    'labelSelector': selector},
            }]}},
        'topologySpreadConstraints': template.get('topologySpreadConstraints') or [{
            'maxSkew': 1, 'topologyKey': 'topology.kubernetes.io/zone',
            'whenUnsatisfiable': 'ScheduleAnyway', 'labelSelector': selector,
        }],
    }  # fmt: skip


def _annotations(cluster: BrokerCluster) -> dict[str, str]:
    found = {**dict(cluster.pod_template.get('annotations') or {}),
             config.CONFIG_CHECKSUM: config.config_checksum(cluster)}  # fmt: skip
    if (redis := config.redis_checksum(cluster)) is not None:
        found[config.REDIS_CHECKSUM] = redis
    return found


def deployment(cluster: BrokerCluster) -> Manifest:
    template = cluster.pod_template
    pod_spec: dict[str, Any] = {
        'automountServiceAccountToken': False,
        'terminationGracePeriodSeconds': cluster.termination_grace_seconds,
        'securityContext': {'runAsNonRoot': True, 'fsGroup': BROKER_UID,
                            'seccompProfile': {'type': 'RuntimeDefault'}},
        'containers': [_container(cluster)],
        'volumes': [
            {'name': 'tmp', 'emptyDir': {}},
            {'name': 'management', 'secret': {
                'secretName': naming.management_secret(cluster), 'optional': True,
                'items': [{'key': 'username', 'path': 'username'},
                          {'key': 'password', 'path': 'password'}],
                'defaultMode': security.READ_ONLY_FOR_GROUP,
            }},
            *security.volumes(cluster),
        ],
        **_spreading(cluster),
    }  # fmt: skip
    for field in ('nodeSelector', 'tolerations', 'priorityClassName'):
        if template.get(field):
            pod_spec[field] = template[field]
    return {
        'apiVersion': 'apps/v1',
        'kind': 'Deployment',
        'metadata': naming.metadata(cluster, naming.child(cluster)),
        'spec': {
            'replicas': cluster.replicas,
            'selector': {'matchLabels': naming.labels(cluster)},
            'strategy': {'type': 'RollingUpdate',
                         'rollingUpdate': {'maxSurge': 1, 'maxUnavailable': 0}},
            'template': {
                'metadata': {
                    'labels': {**dict(template.get('labels') or {}), **naming.all_labels(cluster)},
                    'annotations': _annotations(cluster),
                },
                'spec': pod_spec,
            },
        },
    }  # fmt: skip


def pod_disruption_budget(cluster: BrokerCluster) -> Manifest:
    return {
        'apiVersion': 'policy/v1',
        'kind': 'PodDisruptionBudget',
        'metadata': naming.metadata(cluster, naming.child(cluster)),
        'spec': {
            'maxUnavailable': cluster.pdb_max_unavailable,
            'selector': {'matchLabels': naming.labels(cluster)},
        },
    }
