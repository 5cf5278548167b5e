"""
``spec.redis`` by mode: what the API server admits (the CRD's schema and CEL rules), what the
operator makes of it (``RedisSpec``), the URL it renders, read back by the broker's own parsers
(redis-py's and ``store.connect``'s), and the broker pods' environment and Secrets.
"""

from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from crdcheck import load_crds
from crdrules import admission_errors
from redis.asyncio.connection import parse_url

from shoal_broker import settings as broker
from shoal_broker.store.connect import parse_sentinel_url
from shoal_operator import manifests, redisurl
from shoal_operator.manifests import config
from shoal_operator.models import BrokerCluster, InvalidSpec, RedisMode, RedisSpec

CRD = load_crds()['BrokerCluster']
SENTINELS = ['s-0.sentinel:26379', 's-1.sentinel:26379', 's-2.sentinel']
AUTH = {'secretName': 'redis-auth'}


def body(**redis: Any) -> dict[str, Any]:
    return {'apiVersion': 'shoal.dev/v1alpha1', 'kind': 'BrokerCluster',
            'metadata': {'name': 'shoal', 'namespace': 'apps'},
            'spec': {'redis': redis, 'auth': {'allowAnonymous': True}}}  # fmt: skip


GOOD = {
    'url-secret (as before)': body(secretName='redis'),
    'url-secret-key': body(secretName='redis', key='uri'),
    'url-secret-sentinel-url': body(secretName='redis', mode='sentinel'),
    'standalone-host': body(host='redis.apps.svc'),
    'standalone-host-port-db-auth-tls': body(mode='standalone', host='redis', port=6380, db=2,
                                             auth=AUTH, tls={'caSecretName': 'redis-ca'}),
    'sentinel': body(mode='sentinel', sentinel={'hosts': SENTINELS, 'serviceName': 'shoal'}),
    'sentinel-every-field': body(
        mode='sentinel', db=1, auth={**AUTH, 'usernameKey': 'user', 'passwordKey': 'pass'},
        tls={}, sentinel={'hosts': ['[fd00::1]:26379'], 'serviceName': 'my.primary-1',
                          'auth': {'secretName': 'sentinel-auth'}}),
    'cluster': body(mode='cluster', cluster={'nodes': ['redis-0.redis:6379', 'redis-1.redis']},
                    auth=AUTH),
    'cluster-db-0': body(mode='cluster', cluster={'nodes': ['redis-0']}, db=0, tls={}),
}  # fmt: skip

BAD = {
    'neither': (body(), 'either by secretName'),
    'both': (body(secretName='redis', host='redis'), 'either by secretName'),
    'sentinel-without-service-name': (
        body(mode='sentinel', sentinel={'hosts': SENTINELS}), "'serviceName' is a required"),
    'sentinel-without-hosts': (
        body(mode='sentinel', sentinel={'hosts': [], 'serviceName': 's'}), 'should be non-empty'),
    'sentinel-mode-with-host': (body(mode='sentinel', host='redis'), 'host is the standalone'),
    'sentinel-without-mode': (
        body(sentinel={'hosts': SENTINELS, 'serviceName': 's'}), 'sentinel needs mode sentinel'),
    'cluster-in-sentinel-mode': (
        body(mode='sentinel', cluster={'nodes': ['r']}), 'cluster needs mode cluster'),
    'cluster-mode-alone': (body(mode='cluster'), 'mode cluster needs cluster (seed nodes)'),
    'cluster-mode-with-host': (body(mode='cluster', host='redis'), 'host is the standalone'),
    'cluster-db-1': (body(mode='cluster', cluster={'nodes': ['r']}, db=1), 'only db 0'),
    'url-with-auth': (body(secretName='redis', auth=AUTH), 'the URL carries the credentials'),
    'url-with-tls': (body(secretName='redis', tls={}), 'the URL carries the credentials'),
    'port-without-host': (
        body(mode='cluster', cluster={'nodes': ['r']}, port=1), 'port goes with host'),
    'bad-host': (body(host='redis server'), 'does not match'),
    'bad-sentinel-port': (
        body(mode='sentinel', sentinel={'hosts': ['s:port'], 'serviceName': 's'}),
        'does not match'),
    'bad-service-name': (
        body(mode='sentinel', sentinel={'hosts': SENTINELS, 'serviceName': 'a/b'}),
        'does not match'),
    'unknown-mode': (body(mode='replicated', host='r'), "'replicated' is not one of"),
    'auth-without-secret': (
        body(host='r', auth={'passwordKey': 'p'}), "'secretName' is a required"),
}  # fmt: skip


@pytest.mark.parametrize('name', GOOD)
def test_the_api_server_admits_every_mode_and_the_operator_reads_it(name: str) -> None:
    assert admission_errors(CRD, GOOD[name]) == []
    BrokerCluster.from_body(GOOD[name], default_image='img')  # no InvalidSpec


@pytest.mark.parametrize('name', BAD)
def test_the_api_server_refuses_bad_combinations_with_their_message(name: str) -> None:
    doc, message = BAD[name]
    errors = admission_errors(CRD, doc)
    assert any(message in e for e in errors), errors


@pytest.mark.parametrize('name', [n for n in BAD if not n.startswith(('bad-', 'unknown-'))])
def test_the_operator_refuses_them_too_without_the_api_servers_rules(name: str) -> None:
    """A server without CEL rules, or a resource stored before them, gets the same answer."""
    doc, _ = BAD[name]
    with pytest.raises(InvalidSpec):
        RedisSpec.of(doc['spec'])


def spec_of(doc: dict[str, Any]) -> RedisSpec:
    return RedisSpec.of(doc['spec'])


def test_an_existing_cluster_keeps_its_url_secret_and_its_pod_template() -> None:
    """A cluster written before modes existed: the brokers read the user's Secret, as before,
    nothing is rendered, and the pod template gains no annotation (no roll on upgrade)."""
    cluster = BrokerCluster.from_body(GOOD['url-secret (as before)'], default_image='img')
    assert cluster.redis == RedisSpec(url_secret='redis')
    built = manifests.build_all(cluster, 'redis://ignored:6379/0')
    assert [m['metadata']['name'] for m in built if m['kind'] == 'Secret'] == ['shoal-connection']
    (deployment,) = [m for m in built if m['kind'] == 'Deployment']
    template = deployment['spec']['template']
    assert config.REDIS_CHECKSUM not in template['metadata']['annotations']
    env = {e['name']: e for e in template['spec']['containers'][0]['env']}
    assert env[broker.ENV_REDIS_URL]['valueFrom'] == {
        'secretKeyRef': {'name': 'redis', 'key': 'url'}
    }


def test_a_rendered_url_reaches_the_pods_through_the_operators_secret() -> None:
    cluster = BrokerCluster.from_body(GOOD['standalone-host-port-db-auth-tls'], default_image='i')
    url = redisurl.render(cluster.redis, redisurl.Secrets(password='p'), '/etc/ca.crt')
    built = manifests.build_all(cluster, url)
    (secret,) = [m for m in built if m['metadata']['name'] == 'shoal-redis-url']
    assert secret['data'] == {'url': config._b64(url)}
    assert [m['kind'] for m in built].index('Secret') < [m['kind'] for m in built].index(
        'Deployment'
    )
    (deployment,) = [m for m in built if m['kind'] == 'Deployment']
    pod = deployment['spec']['template']['spec']
    env = {e['name']: e for e in pod['containers'][0]['env']}
    assert env[broker.ENV_REDIS_URL]['valueFrom'] == {
        'secretKeyRef': {'name': 'shoal-redis-url', 'key': 'url'}
    }
    volumes = {v['name']: v['secret'] for v in pod['volumes'] if 'secret' in v}
    assert volumes['redis-ca']['secretName'] == 'redis-ca'
    mounts = {m['name']: m['mountPath'] for m in pod['containers'][0]['volumeMounts']}
    assert mounts['redis-ca'] == '/etc/shoal/redis-ca'
    # credentials not readable yet: the Secret is left as it is, the rest is applied
    assert 'shoal-redis-url' not in [m['metadata']['name'] for m in manifests.build_all(cluster)]


def checksum(**redis: Any) -> str | None:
    return config.redis_checksum(BrokerCluster.from_body(body(**redis), default_image='i'))


def test_a_change_of_where_redis_is_rolls_the_brokers() -> None:
    sentinel = {'hosts': SENTINELS, 'serviceName': 'shoal'}
    first = checksum(mode='sentinel', sentinel=sentinel)
    assert first is not None
    assert checksum(mode='sentinel', sentinel=sentinel) == first
    assert checksum(mode='sentinel', sentinel={**sentinel, 'hosts': SENTINELS[:2]}) != first
    assert checksum(mode='sentinel', sentinel=sentinel, auth=AUTH) != first
    assert checksum(host='redis') != first


def test_standalone_urls_escape_any_password() -> None:
    spec = spec_of(body(host='redis.apps.svc', port=6380, db=3, auth=AUTH))
    password = 'p@ss w+rd/:%?#,'
    url = redisurl.render(spec, redisurl.Secrets(username='app', password=password))
    assert url.startswith('redis://app:')
    parsed = parse_url(url)
    assert (parsed['host'], parsed['port'], parsed['db']) == ('redis.apps.svc', 6380, 3)
    assert (parsed['username'], parsed['password']) == ('app', password)
    assert redisurl.render(spec_of(body(host='r')), redisurl.Secrets()) == 'redis://r/0'


def test_tls_urls_name_the_ca_file_only_with_a_ca() -> None:
    with_ca = spec_of(body(host='r', tls={'caSecretName': 'ca'}))
    url = redisurl.render(with_ca, redisurl.Secrets(), '/etc/shoal/redis-ca/ca.crt')
    assert url == 'rediss://r/0?ssl_ca_certs=%2Fetc%2Fshoal%2Fredis-ca%2Fca.crt'
    assert parse_url(url)['ssl_ca_certs'] == '/etc/shoal/redis-ca/ca.crt'
    assert redisurl.render(spec_of(body(host='r', tls={})), redisurl.Secrets(), '/x') == (
        'rediss://r/0'
    )


def test_sentinel_urls_read_back_as_the_broker_reads_them() -> None:
    spec = spec_of(GOOD['sentinel-every-field'])
    secrets = redisurl.Secrets('app', 'pw:@/', 'watcher', 's&p=w d')
    url = redisurl.render(spec, secrets)
    assert url.startswith('rediss+sentinel://app:pw%3A%40%2F@[fd00::1]:26379/my.primary-1/1?')
    parsed = parse_sentinel_url(url)
    assert parsed.sentinels == (('fd00::1', 26379),)
    assert parsed.service == 'my.primary-1'
    assert parsed.tls
    assert (parsed.connection['username'], parsed.connection['password']) == ('app', 'pw:@/')
    assert parsed.connection['db'] == 1
    assert (parsed.sentinel['username'], parsed.sentinel['password']) == ('watcher', 's&p=w d')
    plain = parse_sentinel_url(redisurl.render(spec_of(GOOD['sentinel']), redisurl.Secrets()))
    assert plain.sentinels == (('s-0.sentinel', 26379), ('s-1.sentinel', 26379),
                               ('s-2.sentinel', 26379))  # fmt: skip
    assert 'password' not in plain.sentinel


def test_cluster_urls_list_the_seed_nodes_without_a_db() -> None:
    spec = spec_of(GOOD['cluster'])
    url = redisurl.render(spec, redisurl.Secrets(password='pw'))
    assert url == 'redis+cluster://:pw@redis-0.redis:6379,redis-1.redis'
    tls = redisurl.render(spec_of(GOOD['cluster-db-0']), redisurl.Secrets())
    assert tls == 'rediss+cluster://redis-0'
    assert urlsplit(url).path == ''
    assert parse_qs(urlsplit(url).query) == {}


@pytest.mark.parametrize(('mode', 'url', 'problem'), [
    (None, 'redis+sentinel://s/shoal', None),
    (RedisMode.SENTINEL, 'redis+sentinel://s/shoal', None),
    (RedisMode.SENTINEL, 'rediss+sentinel://s/shoal', None),
    (RedisMode.STANDALONE, 'unix:///run/redis.sock', None),
    (RedisMode.CLUSTER, 'rediss+cluster://a,b', None),
    (RedisMode.SENTINEL, 'redis://r:6379/0',
     "spec.redis.mode is sentinel but the URL's scheme is redis"),
    (RedisMode.STANDALONE, 'no-scheme',
     "spec.redis.mode is standalone but the URL's scheme is (none)"),
])  # fmt: skip
def test_a_url_secret_is_checked_against_the_mode_when_one_is_given(
    mode: RedisMode | None, url: str, problem: str | None
) -> None:
    assert redisurl.mismatch(RedisSpec(mode=mode, url_secret='s'), url) == problem
