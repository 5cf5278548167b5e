"""
Redis as the chart provides it (bundled StatefulSet with AOF on a PVC, or an existing one by
Secret) and the example BrokerCluster wired to it.
"""

import base64
from urllib.parse import urlsplit

import pytest
import redis
from chartrender import NAMESPACE, container, env, find, one, render, render_raw
from helm_python import HelmRenderError, HelmValuesError

from shoal_broker.store.connect import parse_sentinel_url


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


HPA = {'enabled': True, 'minReplicas': 2, 'maxReplicas': 5, 'targetConnectionsPerReplica': 1500,
       'externalMetrics': [{'name': 'shoal_messages_enqueued_rate', 'matchLabels': {'job': 'shoal'},
                            'averageValue': '5000'}]}  # fmt: skip


def test_an_hpa_owns_the_replicas_the_chart_leaves_out() -> None:
    cluster = one(render({'exampleCluster': {'replicas': 3, 'autoscaling': HPA}}), 'BrokerCluster')
    assert 'replicas' not in cluster['spec']  # helm upgrade does not set back what the HPA wrote
    assert cluster['spec']['autoscaling'] == {**HPA, 'targetCPUUtilizationPercentage': 70,
                                              'scaleDownStabilizationSeconds': 300}  # fmt: skip
    assert one(render(), 'BrokerCluster')['spec']['replicas'] == 2
    with pytest.raises(HelmRenderError, match='choose one'):
        render_raw({'exampleCluster': {'autoscaling': {'enabled': True, 'fromAnalytics': True}}})
    metric = {'name': 'm', 'averageValue': 5000}
    with pytest.raises(HelmValuesError, match='averageValue'):  # quantities are strings
        render_raw({'exampleCluster': {'autoscaling': {'enabled': True,
                                                       'externalMetrics': [metric]}}})  # fmt: skip


def test_notes_tell_how_to_connect_and_test() -> None:
    notes = render_raw()['shoal/templates/NOTES.txt']
    assert f'amqp://shoal.{NAMESPACE}.svc:5672' in notes
    assert f'helm test rel -n {NAMESPACE}' in notes
    assert 'secretName: rel-shoal-redis' in notes


SENTINEL = {'redis': {'mode': 'sentinel', 'auth': {'password': 'p@ss w+rd/:%'}}}
SENTINEL_HOSTS = [f'rel-shoal-redis-sentinel-{i}.rel-shoal-redis-sentinel.{NAMESPACE}.svc:26379'
                  for i in range(3)]  # fmt: skip


def test_the_default_install_has_one_redis_and_no_sentinel() -> None:
    manifests = render()
    assert [s['metadata']['name'] for s in find(manifests, 'StatefulSet')] == ['rel-shoal-redis']
    assert find(manifests, 'PodDisruptionBudget') == []
    assert 'affinity' not in one(manifests, 'StatefulSet')['spec']['template']['spec']


def test_sentinel_mode_runs_a_primary_replicas_and_three_sentinels_with_budgets() -> None:
    manifests = render(SENTINEL)
    sets = {s['metadata']['name']: s['spec'] for s in find(manifests, 'StatefulSet')}
    assert {name: spec['replicas'] for name, spec in sets.items()} == {
        'rel-shoal-redis': 1, 'rel-shoal-redis-replica': 2, 'rel-shoal-redis-sentinel': 3,
    }  # fmt: skip
    for name in ('rel-shoal-redis', 'rel-shoal-redis-replica'):  # both keep the AOF on a PVC
        (claim,) = sets[name]['volumeClaimTemplates']
        assert claim['spec']['resources']['requests']['storage'] == '8Gi'
    headless = {s['metadata']['name'] for s in find(manifests, 'Service')
                if s['spec'].get('clusterIP') == 'None'}  # fmt: skip
    assert headless == {'rel-shoal-redis-replica', 'rel-shoal-redis-sentinel'}
    budgets = {p['metadata']['name']: p['spec'] for p in find(manifests, 'PodDisruptionBudget')}
    assert budgets['rel-shoal-redis-sentinel']['maxUnavailable'] == 1
    assert budgets['rel-shoal-redis']['maxUnavailable'] == 1
    # the nodes' budget covers the first node and its replicas, not the sentinels
    node_labels = budgets['rel-shoal-redis']['selector']['matchLabels'].items()
    for name, selected in (('rel-shoal-redis', True), ('rel-shoal-redis-replica', True),
                           ('rel-shoal-redis-sentinel', False)):  # fmt: skip
        labels = sets[name]['template']['metadata']['labels'].items()
        assert (node_labels <= labels) is selected, name
    first = sets['rel-shoal-redis']['template']['spec']
    preferred = first['affinity']['podAntiAffinity'][
        'preferredDuringSchedulingIgnoredDuringExecution'
    ]
    assert preferred[0]['podAffinityTerm']['labelSelector']['matchLabels'].items() == node_labels
    sentinel_pod = sets['rel-shoal-redis-sentinel']['template']['spec']
    assert (
        'preferredDuringSchedulingIgnoredDuringExecution'
        in sentinel_pod['affinity']['podAntiAffinity']
    )
    hard = render({'redis': {'mode': 'sentinel', 'podAntiAffinity': 'hard'}})
    for statefulset in find(hard, 'StatefulSet'):
        anti = statefulset['spec']['template']['spec']['affinity']['podAntiAffinity']
        assert list(anti) == ['requiredDuringSchedulingIgnoredDuringExecution']


def test_sentinel_mode_keeps_the_first_node_where_a_standalone_install_had_its_data() -> None:
    """helm upgrade from standalone to sentinel changes only what a StatefulSet lets change
    (the API server refuses any other change of its spec)."""
    before = one(render(), 'StatefulSet', 'rel-shoal-redis')['spec']
    after = one(render(SENTINEL), 'StatefulSet', 'rel-shoal-redis')['spec']
    mutable = {'replicas', 'template', 'updateStrategy', 'minReadySeconds',
               'persistentVolumeClaimRetentionPolicy', 'ordinals'}  # fmt: skip
    assert {k: v for k, v in after.items() if k not in mutable} == {
        k: v for k, v in before.items() if k not in mutable
    }
    assert (
        one(render(SENTINEL), 'Service', 'rel-shoal-redis')['spec']
        == one(render(), 'Service', 'rel-shoal-redis')['spec']
    )


def test_sentinel_mode_secret_url_and_example_cluster_name_the_sentinels() -> None:
    manifests = render(SENTINEL)
    url = secret_value(one(manifests, 'Secret', 'rel-shoal-redis'), 'url')
    parsed = parse_sentinel_url(url)
    assert [f'{h}:{p}' for h, p in parsed.sentinels] == SENTINEL_HOSTS
    assert (parsed.service, parsed.connection['db']) == ('shoal', 0)
    assert parsed.connection['password'] == 'p@ss w+rd/:%'
    assert parsed.sentinel['password'] == 'p@ss w+rd/:%'
    assert one(manifests, 'BrokerCluster')['spec']['redis'] == {
        'mode': 'sentinel',
        'sentinel': {'hosts': SENTINEL_HOSTS, 'serviceName': 'shoal',
                     'auth': {'secretName': 'rel-shoal-redis'}},
        'auth': {'secretName': 'rel-shoal-redis'},
    }  # fmt: skip
    open_install = render({'redis': {'mode': 'sentinel', 'auth': {'enabled': False}}})
    assert one(open_install, 'BrokerCluster')['spec']['redis'] == {
        'mode': 'sentinel',
        'sentinel': {'hosts': SENTINEL_HOSTS, 'serviceName': 'shoal'},
    }
    open_url = parse_sentinel_url(secret_value(one(open_install, 'Secret'), 'url'))
    assert 'password' not in open_url.connection
    assert 'password' not in open_url.sentinel


def test_the_analytics_job_on_sentinel_reads_the_sentinel_url_and_may_reach_the_sentinels() -> None:
    manifests = render(
        {'redis': {'mode': 'sentinel'}, 'analytics': {'enabled': True},
         'networkPolicy': {'enabled': True}}
    )  # fmt: skip
    secret = one(manifests, 'Secret')
    job = one(manifests, 'CronJob')['spec']['jobTemplate']['spec']['template']['spec']
    reference = env(container(job, 'analytics'))['SHOAL_REDIS_URL']['secretKeyRef']
    assert reference['name'] == secret['metadata']['name']
    assert secret_value(secret, reference['key']).startswith('redis+sentinel://')
    (policy,) = [
        p for p in find(manifests, 'NetworkPolicy')
        if p['spec']['podSelector']['matchLabels'].get('app.kubernetes.io/component') == 'analytics'
    ]  # fmt: skip
    egress_ports = {
        port['port'] for rule in policy['spec']['egress'] for port in rule.get('ports', [])
    }
    assert 26379 in egress_ports


def test_a_quorum_above_the_sentinels_is_refused() -> None:
    with pytest.raises(HelmRenderError, match='quorum must not exceed'):
        render_raw({'redis': {'mode': 'sentinel', 'sentinel': {'replicas': 1}}})
