"""
The analytics job on Sentinel and Cluster URLs: the preflight probe, the stream source and the
published summary reach the primary the sentinels name or the node serving the key's slot, and
the password is kept out of the URL Spark's options carry (it travels in the environment).
"""

from collections.abc import Iterator

import pytest
from redisclusters import ClusterGroup
from sentinels import SentinelGroup

from shoal_analytics import preflight, source
from shoal_analytics.errors import AnalyticsError
from shoal_analytics.publish import publish_to
from shoal_broker.metrics.records import AnalyticsSummary
from shoal_broker.store import keys
from shoal_broker.store.keys import METRICS

PASSWORD = 'p@ss:word'


@pytest.mark.parametrize(
    ('url', 'without', 'password'),
    [
        ('redis://127.0.0.1:6379/0', 'redis://127.0.0.1:6379/0', None),
        ('redis://:pw@127.0.0.1:6379/0', 'redis://127.0.0.1:6379/0', 'pw'),
        (
            'rediss://app:pw@host/2?ssl_cert_reqs=none',
            'rediss://app@host/2?ssl_cert_reqs=none',
            'pw',
        ),
        (
            'redis+sentinel://:p%40ss@h1:26379,h2:26380/shoal/0?sentinel_password=s',
            'redis+sentinel://h1:26379,h2:26380/shoal/0?sentinel_password=s',
            'p@ss',
        ),
        ('redis+cluster://:pw@h1:7000,h2:7001', 'redis+cluster://h1:7000,h2:7001', 'pw'),
    ],
)
def test_the_password_leaves_the_url_and_the_hosts_and_user_stay(
    url: str, without: str, password: str | None
) -> None:
    assert preflight.split_password(url) == (without, password)


def summary() -> AnalyticsSummary:
    return AnalyticsSummary(
        generated_at_ms=1, window_start_ms=0, window_end_ms=1, records=2, current_replicas=2,
        recommended_replicas=3, reason='backlog grows',
    )  # fmt: skip


@pytest.fixture(scope='module', params=['sentinel', 'cluster'])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == 'sentinel':
        sentinels = SentinelGroup(password=PASSWORD)
        try:
            yield sentinels.url.replace(PASSWORD, 'p%40ss%3Aword')
        finally:
            sentinels.stop()
    else:
        cluster = ClusterGroup()
        try:
            yield cluster.url
        finally:
            cluster.stop()


def test_probe_read_and_publish_reach_the_store(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    preflight.reachable_redis(url)
    writer = preflight.client(url, decode_responses=True)
    try:
        writer.delete(METRICS, keys.ANALYTICS_SUMMARY)
        ids = [writer.xadd(METRICS, {'n': str(n)}) for n in range(3)]

        stripped, password = preflight.split_password(url)
        monkeypatch.setenv('SHOAL_TEST_ANALYTICS_PASSWORD', password or '')
        options = source._Options({'url': stripped, 'passwordEnv': 'SHOAL_TEST_ANALYTICS_PASSWORD'})
        reader = options.connect()
        try:
            read = source._xrange(reader, options.stream, '-', '+', 10)
        finally:
            reader.close()
        assert [entry_id for entry_id, _ in read] == ids

        publish_to(url, summary())
        assert AnalyticsSummary.from_fields(writer.hgetall(keys.ANALYTICS_SUMMARY)) == summary()
    finally:
        writer.close()


def test_an_unreachable_cluster_is_one_line_naming_it_without_the_password() -> None:
    url = 'redis+cluster://:secret@127.0.0.1:1'
    with pytest.raises(AnalyticsError) as refused:
        preflight.reachable_redis(url)
    assert 'cannot reach Redis at redis+cluster://127.0.0.1:1' in str(refused.value)
    assert 'secret' not in str(refused.value)
