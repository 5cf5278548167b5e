"""A BrokerCluster asking for a child of an optional kind the API server does not serve (a
ServiceMonitor without the Prometheus Operator's CRD: the create answers 404) gets the rest of its
children, a ChildrenApplied=False condition and one Warning Event naming the kind, and a log line;
once the kind is served the child is created and the condition clears."""

import logging
from typing import Any

import pytest
from kubeemulator import Kube, cluster_body, condition

MONITOR = {'metrics': {'serviceMonitor': {'enabled': True}}}


async def test_a_service_monitor_without_its_crd_is_reported_not_dropped(
    operator: Kube, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    operator.emulator.unserved = frozenset({'servicemonitors'})
    await operator.redis_secret(store_url)
    with caplog.at_level(logging.WARNING, logger='shoal_operator'):
        await operator.create('brokerclusters', cluster_body(**MONITOR))

        async def reported(status: str) -> Any:
            body = await operator.get('brokerclusters', 'shoal') or {}
            found = condition(body, 'ChildrenApplied')
            return found if found.get('status') == status else None

        found = await operator.eventually(lambda: reported('False'), 'ChildrenApplied=False')
        assert found['reason'] == 'KindNotServed'
        assert found['message'].startswith(
            'ServiceMonitor (monitoring.coreos.com/v1) is not served by the API server'
        )
        assert 'spec.metrics.serviceMonitor.enabled' in found['message']
        assert await operator.get('deployments', 'shoal', api_version='apps/v1') is not None
        body = await operator.get('brokerclusters', 'shoal')
        assert condition(body, 'Ready').get('reason') != 'KindNotServed'  # brokers run without
        await operator.observer_passes(2)
    assert (await operator.event_reasons('shoal')).count('KindNotServed') == 1
    logged = [r.getMessage() for r in caplog.records if 'ServiceMonitor' in r.getMessage()]
    assert len(logged) == 1, logged

    operator.emulator.unserved = frozenset()
    await operator.eventually(lambda: reported('True'), 'ChildrenApplied=True')
    monitor = await operator.get('servicemonitors', 'shoal', api_version='monitoring.coreos.com/v1')
    assert monitor is not None
