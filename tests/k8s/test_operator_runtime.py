"""The operator's runtime on its own: what it holds is released when the operator stops."""

import gc
import warnings

import kopf
from kubeemulator import Kube, cluster_body
from processes import RedisServer

from shoal_operator import k8s
from shoal_operator.models import ClusterRef
from shoal_operator.runtime import Runtime, Settings


async def test_a_registry_used_after_the_first_close_is_closed_by_the_second(
    kube: Kube, redis_server: RedisServer
) -> None:
    """kopf's cleanup closes the runtime while the observer may still be in its last round;
    cli.run closes it again once everything has stopped. A connection that last round opened
    must not outlive the operator (it once did, as an unclosed-connection ResourceWarning)."""
    await kube.redis_secret(redis_server.url)
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
