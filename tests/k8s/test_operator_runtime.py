"""The operator's runtime on its own: what it holds is released when the operator stops, and
its settings."""

import gc
import warnings

import kopf
import pytest
from kubeemulator import Kube, cluster_body

from shoal_operator import k8s
from shoal_operator.models import ClusterRef
from shoal_operator.runtime import Runtime, Settings


async def test_a_registry_used_after_the_first_close_is_closed_by_the_second(
    kube: Kube, store_url: str
) -> None:
    """kopf's cleanup closes the runtime while the observer may still be in its last round;
    cli.run closes it again once everything has stopped. A connection that last round opened
    must not outlive the operator (it once did, as an unclosed-connection ResourceWarning)."""
    await kube.redis_secret(store_url)
    await kube.create('brokerclusters', cluster_body())
    runtime = Runtime(Settings())
    runtime.kube = k8s.Kube(kopf.ConnectionInfo(server=str(kube.emulator.url)))
    cluster = await runtime.cluster(ClusterRef('default', 'shoal'), 'default')
    registry = await runtime.registry(cluster)
    await registry.info()
    await runtime.close()  # kopf's cleanup
    await registry.info()  # the observer's last round: connects again
    await runtime.close()  # cli.run, once the observer and kopf have stopped
    del registry  # as the observer's round ends
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always', ResourceWarning)
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_watched_namespaces_are_plain_names() -> None:
    # kopf would take a glob as a pattern, which it can only resolve by listing namespaces at
    # cluster scope, which namespaced RBAC forbids
    settings = Settings.from_env({'SHOAL_OPERATOR_NAMESPACES': ' team-a, team-b ,'})
    assert settings.namespaces == ('team-a', 'team-b')
    assert Settings.from_env({}).namespaces == ()
    with pytest.raises(ValueError, match='namespace names'):
        Settings.from_env({'SHOAL_OPERATOR_NAMESPACES': 'team-*'})


def test_a_finalizer_only_where_the_operators_permissions_outlive_the_namespace() -> None:
    cluster_wide = Settings(own_namespace='shoal-system')
    assert cluster_wide.permissions_outlive('team-a')
    assert not cluster_wide.permissions_outlive('shoal-system')  # its token goes with it
    assert not Settings().permissions_outlive('team-a')  # own namespace unknown
    namespaced = Settings(namespaces=('team-a',), own_namespace='shoal-system')
    assert not namespaced.permissions_outlive('team-a')  # the Role goes with the namespace
