"""Closing the loop (issue #6): the analytics job's summary reaches a BrokerCluster's status,
conditions and Events, and its replica recommendation is applied when the cluster asks for it."""

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kubeemulator import Kube, cluster_body, condition

from shoal_broker.metrics.records import AnalyticsSummary, Anomaly
from shoal_broker.store import connect, keys
from shoal_operator import analytics
from shoal_operator.models import BrokerCluster

NOW_MS = int(time.time() * 1000)


def summary(recommended: int, *anomalies: Anomaly) -> AnalyticsSummary:
    return AnalyticsSummary(
        generated_at_ms=NOW_MS, window_start_ms=NOW_MS - 3_600_000, window_end_ms=NOW_MS,
        records=1200, current_replicas=2, recommended_replicas=recommended,
        reason='peak 5400 msg/s over 2500 msg/s per replica', anomalies=anomalies,
    )  # fmt: skip


BACKLOG = Anomaly(flag='growing_backlog', subscription='billing', severity='critical',
                  detail='+40 msg/s for 30 min', value=40.0)  # fmt: skip


def model(**autoscaling: Any) -> BrokerCluster:
    spec = {
        'redis': {'secretName': 'r'},
        'auth': {'usersSecretName': 'users'},
        'replicas': 2,
        'autoscaling': autoscaling,
    }
    body = {'metadata': {'name': 'shoal'}, 'spec': spec}
    return BrokerCluster.from_body(body, default_image='i')


def test_the_recommendation_is_applied_only_when_asked_and_within_bounds() -> None:
    assert analytics.replicas_to_apply(model(), summary(5)) is None
    on = {'fromAnalytics': True, 'minReplicas': 2, 'maxReplicas': 4}
    assert analytics.replicas_to_apply(model(**on), summary(3)) == 3
    assert analytics.replicas_to_apply(model(**on), summary(9)) == 4
    assert analytics.replicas_to_apply(model(**on), summary(1)) is None  # 2 already
    assert analytics.replicas_to_apply(model(**on), summary(0)) is None


def test_the_status_section_condition_and_events_of_a_summary() -> None:
    found = summary(3, BACKLOG)
    section = analytics.section(found)
    assert section['recommendedReplicas'] == 3
    assert section['anomalies'] == [{'flag': 'growing_backlog', 'severity': 'critical',
                                     'subscription': 'billing', 'detail': '+40 msg/s for 30 min',
                                     'value': 40.0}]  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    flagged = analytics.anomalies_condition(found, generation=1, previous=[], now=now)
    assert (flagged['status'], flagged['reason']) == ('True', 'growing_backlog')
    assert 'billing' in flagged['message']
    quiet = analytics.anomalies_condition(summary(2), generation=1, previous=[flagged], now=now)
    assert (quiet['status'], quiet['reason']) == ('False', 'NoAnomalies')
    assert [reason for _, reason, _ in analytics.events(found)] == [
        'Anomaly',
        'ReplicasRecommended',
    ]
    assert analytics.is_new(found, {})
    assert not analytics.is_new(found, {'analytics': section})


@pytest.fixture
def summary_in_redis(store_url: str) -> Iterator[Any]:
    client = connect.sync_client_of_any_mode(store_url, decode_responses=True)
    client.hset(keys.ANALYTICS_SUMMARY, mapping=summary(5, BACKLOG).to_fields())
    yield client
    client.delete(keys.ANALYTICS_SUMMARY)
    client.close()


async def test_the_operator_reports_the_summary_and_scales_within_bounds(
    operator: Kube, store_url: str, summary_in_redis: redis.Redis
) -> None:
    await operator.redis_secret(store_url)
    await operator.create('brokerclusters', cluster_body(
        autoscaling={'fromAnalytics': True, 'minReplicas': 1, 'maxReplicas': 3}))  # fmt: skip

    async def scaled() -> Any:
        deployment = await operator.get('deployments', 'shoal', api_version='apps/v1')
        return deployment is not None and deployment['spec']['replicas'] == 3

    await operator.eventually(scaled, 'the Deployment at the bounded recommendation')
    body = await operator.get('brokerclusters', 'shoal')
    assert body is not None
    assert body['spec']['replicas'] == 3

    async def reported() -> Any:
        found = await operator.get('brokerclusters', 'shoal')
        has_condition = condition(found, 'AnomaliesDetected').get('status') == 'True'
        return (found or {}).get('status', {}).get('analytics') and has_condition and found

    body = await operator.eventually(reported, 'the summary on the status')
    assert body['status']['analytics']['recommendedReplicas'] == 5
    assert condition(body, 'AnomaliesDetected')['reason'] == 'growing_backlog'

    async def posted() -> Any:
        reasons = await operator.event_reasons('shoal')
        return {'Anomaly', 'ReplicasRecommended', 'ScaledFromAnalytics'} <= set(reasons)

    await operator.eventually(posted, 'the Events')
