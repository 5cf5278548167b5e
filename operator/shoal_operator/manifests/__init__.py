"""
Pure builders: a BrokerCluster model -> the Kubernetes objects that run it.

``build_all`` orders them so what the Deployment reads (ConfigMap, Secrets) comes first;
``switched_off`` names the objects a spec can switch off, which the operator deletes when off;
``OPTIONAL_KINDS`` the kinds whose CRD a cluster may lack (the rest of the cluster works without).
"""

from shoal_operator.manifests import autoscaler, config, network, workload
from shoal_operator.manifests.config import Manifest
from shoal_operator.models import BrokerCluster

__all__ = ['OPTIONAL_KINDS', 'Manifest', 'build_all', 'switched_off']

OPTIONAL_KINDS = {'ServiceMonitor': 'spec.metrics.serviceMonitor.enabled'}
"""Kind -> the spec field that asks for it."""


def build_all(
    cluster: BrokerCluster, redis_url: str | None = None, management_password: str | None = None
) -> list[Manifest]:
    """``redis_url``: the rendered Redis URL (``redisurl.render``) of a cluster whose spec names
    its Redis by mode and hosts; None leaves its Secret as it is (its credentials cannot be read
    now), and for a cluster whose URL is the user's Secret. ``management_password``: the
    management Secret's (None leaves that Secret as it is)."""
    optional = [
        autoscaler.horizontal_pod_autoscaler(cluster),
        network.network_policy(cluster),
        network.service_monitor(cluster),
    ]
    rendered = []
    if cluster.redis.rendered and redis_url is not None:
        rendered.append(config.redis_url_secret(cluster, redis_url))
    if management_password is not None:
        rendered.append(config.management_secret(cluster, management_password))
    return [
        config.configmap(cluster),
        *rendered,
        config.connection_secret(cluster),
        workload.deployment(cluster),
        network.service(cluster),
        network.headless_service(cluster),
        workload.pod_disruption_budget(cluster),
        *[m for m in optional if m is not None],
    ]


def switched_off(cluster: BrokerCluster) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of optional objects the spec does not want (to be deleted)."""
    name = cluster.meta.name
    off = []
    if cluster.network_policy_from is None:
        off.append(('networking.k8s.io/v1', 'NetworkPolicy', name))
    if cluster.service_monitor is None:
        off.append(('monitoring.coreos.com/v1', 'ServiceMonitor', name))
    if not cluster.autoscaling.enabled:
        off.append((autoscaler.API, autoscaler.KIND, name))
    return off
