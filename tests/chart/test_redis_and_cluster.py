"""
Redis as the chart provides it (bundled StatefulSet with AOF on a PVC, or an existing one by
Secret) and the example BrokerCluster wired to it.
"""

import base64
from urllib.parse import urlsplit

import pytest
import redis
from chartrender import NAMESPACE, container, env, find, one, render, render_raw
from helm_python import HelmRenderError


def secret_value(secret: dict[str, dict[str, str]], key: str) -> str:
    return base64.b64decode(secret['data'][key]).decode()


def test_bundled_redis_keeps_an_append_only_file_on_a_volume() -> None:
    manifests = render()
    statefulset = one(manifests, 'StatefulSet', 'rel-shoal-redis')
    redis = container(statefulset['spec']['template']['spec'], 'redis')
    args = redis['args']
    assert args[args.index('--appendonly') + 1] == 'yes'
    assert args[args.index('--appendfsync') + 1] == 'everysec'
    assert args[args.index('--dir') + 1] == '/data'
    assert {'name': 'data', 'mountPath': '/data'} in redis['volumeMounts']
    (claim,) = statefulset['spec']['volumeClaimTemplates']
    assert claim['metadata']['name'] == 'data'
    assert claim['spec']['resources']['requests']['storage'] == '8Gi'
    assert args[args.index('--requirepass') + 1] == '$(REDIS_PASSWORD)'
    assert env(redis)['REDIS_PASSWORD'] == {
        'secretKeyRef': {'name': 'rel-shoal-redis', 'key': 'password'}
    }


def test_bundled_redis_secret_holds_a_url_with_the_password() -> None:
    manifests = render({'redis': {'auth': {'password': 'p@ss w+rd/:%'}}})
    secret = one(manifests, 'Secret', 'rel-shoal-redis')
    url = urlsplit(secret_value(secret, 'url'))
    assert (url.scheme, url.hostname, url.port, url.path) == (
        'redis',
        f'rel-shoal-redis.{NAMESPACE}.svc',
        6379,
        '/0',
    )
    assert secret_value(secret, 'password') == 'p@ss w+rd/:%'
    # Escaped in the URL, so that a password may hold any character: redis-py reads it back.
    pool = redis.Redis.from_url(secret_value(secret, 'url')).connection_pool
    assert pool.connection_kwargs['password'] == 'p@ss w+rd/:%'
    service = one(manifests, 'Service', 'rel-shoal-redis')
    pod_labels = one(manifests, 'StatefulSet')['spec']['template']['metadata']['labels']
    assert service['spec']['selector'].items() <= pod_labels.items()


def test_generated_password_is_long_and_redis_without_auth_has_none_in_the_url() -> None:
    secret = one(render(), 'Secret', 'rel-shoal-redis')
    assert len(secret_value(secret, 'password')) == 32
    open_secret = one(render({'redis': {'auth': {'enabled': False}}}), 'Secret')
    assert 'password' not in open_secret['data']
    assert secret_value(open_secret, 'url') == f'redis://rel-shoal-redis.{NAMESPACE}.svc:6379/0'


def test_example_cluster_uses_the_bundled_redis_secret() -> None:
    cluster = one(render(), 'BrokerCluster')
    assert cluster['apiVersion'] == 'shoal.dev/v1alpha1'
    assert cluster['metadata'] == {
        'name': 'shoal',
        'namespace': NAMESPACE,
        'labels': cluster['metadata']['labels'],
    }
    assert cluster['spec'] == {
        'replicas': 2,
        'redis': {'secretName': 'rel-shoal-redis', 'key': 'url'},
        'auth': {'allowAnonymous': False, 'usersSecretName': 'shoal-users'},
    }


def test_existing_redis_replaces_the_bundled_one_everywhere() -> None:
    values = {
        'redis': {'enabled': False, 'existingSecret': {'name': 'corp-redis', 'key': 'uri'}},
        'analytics': {'enabled': True},
    }
    manifests = render(values)
    assert find(manifests, 'StatefulSet') == []
    assert find(manifests, 'Secret') == []
    assert one(manifests, 'BrokerCluster')['spec']['redis'] == {
        'secretName': 'corp-redis',
        'key': 'uri',
    }
    job = one(manifests, 'CronJob')['spec']['jobTemplate']['spec']['template']['spec']
    assert env(container(job, 'analytics'))['SHOAL_REDIS_URL'] == {
        'secretKeyRef': {'name': 'corp-redis', 'key': 'uri'}
    }


def test_autoscaling_from_analytics_reaches_the_cluster_and_is_bounded() -> None:
    autoscaling = {'fromAnalytics': True, 'minReplicas': 3, 'maxReplicas': 9}
    cluster = one(render({'exampleCluster': {'autoscaling': autoscaling}}), 'BrokerCluster')
    assert cluster['spec']['autoscaling'] == autoscaling
    with pytest.raises(HelmRenderError, match='minReplicas must not exceed maxReplicas'):
        render_raw({'exampleCluster': {'autoscaling': {'minReplicas': 5, 'maxReplicas': 4}}})


def test_notes_tell_how_to_connect_and_test() -> None:
    notes = render_raw()['shoal/templates/NOTES.txt']
    assert f'amqp://shoal.{NAMESPACE}.svc:5672' in notes
    assert f'helm test rel -n {NAMESPACE}' in notes
    assert 'secretName: rel-shoal-redis' in notes
