"""The pure builders: a BrokerCluster model in, Kubernetes objects out (no API server)."""

import base64
import re
from typing import Any

import pytest

from shoal_broker import settings as broker
from shoal_operator import manifests
from shoal_operator.manifests import applied, config, naming, network, security, workload
from shoal_operator.models import BrokerCluster, InvalidSpec


def model(**spec: Any) -> BrokerCluster:
    """A cluster from ``spec`` (anonymous clients allowed unless ``spec`` says otherwise)."""
    body = {'metadata': {'name': 'shoal', 'namespace': 'msg', 'uid': 'u1', 'generation': 3},
            'spec': {'redis': {'secretName': 'redis'}, 'auth': {'allowAnonymous': True},
                     **spec}}  # fmt: skip
    return BrokerCluster.from_body(body, default_image='img:1')


def test_the_deployment_runs_stateless_non_root_replicas_with_probes_and_a_drain() -> None:
    d = workload.deployment(model(replicas=3, scaleDown={'drainSeconds': 7}))
    assert d['spec']['replicas'] == 3
    assert d['spec']['strategy']['rollingUpdate'] == {'maxSurge': 1, 'maxUnavailable': 0}
    pod = d['spec']['template']['spec']
    [container] = pod['containers']
    assert container['image'] == 'img:1'
    assert {p['name']: p['containerPort'] for p in container['ports']} == {
        'amqp': 5672,
        'http': 8080,
    }
    assert container['readinessProbe']['httpGet']['path'] == '/readyz'
    assert container['livenessProbe']['httpGet']['path'] == '/livez'
    assert container['lifecycle']['preStop']['exec']['command'] == ['sleep', '7']
    security = container['securityContext']
    assert security['runAsNonRoot'] is True
    assert security['runAsUser'] == 10001
    assert security['readOnlyRootFilesystem'] is True
    assert container['volumeMounts'][0] == {'name': 'tmp', 'mountPath': '/tmp'}
    assert pod['volumes'][0] == {'name': 'tmp', 'emptyDir': {}}
    # the management Secret, optional: the pods may start before the operator writes it
    management = {'name': 'management', 'mountPath': '/etc/shoal/management', 'readOnly': True}
    assert container['volumeMounts'][1:] == [management]
    assert pod['volumes'][1]['secret']['secretName'] == 'shoal-management'
    assert pod['volumes'][1]['secret']['optional'] is True
    assert pod['terminationGracePeriodSeconds'] == 7 + 20 + 5
    env = {e['name']: e for e in container['env']}
    assert env[broker.ENV_REDIS_URL]['valueFrom']['secretKeyRef'] == {'name': 'redis', 'key': 'url'}
    assert container['envFrom'] == [{'configMapRef': {'name': 'shoal-config'}}]
    anti = pod['affinity']['podAntiAffinity']['preferredDuringSchedulingIgnoredDuringExecution']
    assert anti[0]['podAffinityTerm']['topologyKey'] == 'kubernetes.io/hostname'
    assert pod['topologySpreadConstraints'][0]['topologyKey'] == 'topology.kubernetes.io/zone'
    assert d['spec']['selector']['matchLabels'] == naming.labels(model())


def test_pod_template_overrides_replace_the_defaults() -> None:
    affinity = {'nodeAffinity': {'x': 1}}
    d = workload.deployment(
        model(
            podTemplate={
                'affinity': affinity,
                'tolerations': [{'key': 'k'}],
                'nodeSelector': {'a': 'b'},
                'labels': {'team': 'x'},
                'annotations': {'note': 'y'},
            },
            resources={'limits': {'cpu': 1}},
        )
    )
    pod = d['spec']['template']['spec']
    assert pod['affinity'] == affinity
    assert pod['tolerations'] == [{'key': 'k'}]
    assert pod['nodeSelector'] == {'a': 'b'}
    assert pod['containers'][0]['resources'] == {'limits': {'cpu': 1}}
    meta = d['spec']['template']['metadata']
    assert meta['labels']['team'] == 'x'
    assert meta['labels']['app.kubernetes.io/instance'] == 'shoal'  # ours cannot be overridden
    assert meta['annotations'] == {
        'note': 'y',
        config.CONFIG_CHECKSUM: config.config_checksum(model()),
    }


def test_the_configmap_carries_the_broker_settings_as_its_environment() -> None:
    data = config.configmap(
        model(
            durability='fsync',
            broker={
                'autoCreateQueues': False,
                'maxDeliveryAttempts': 5,
                'deadLetterAddress': 'DLQ',
                'handover': False,
                'deliverAhead': False,
                'exclusiveAddresses': ['orders.*', 'fx'],
            },
        )
    )['data']
    assert data[broker.ENV_LISTEN] == '0.0.0.0:5672'
    assert data[broker.ENV_HTTP] == '0.0.0.0:8080'
    assert data[broker.ENV_DURABILITY] == 'fsync'
    assert data[broker.ENV_AUTO_CREATE_QUEUES] == 'false'
    assert data[broker.ENV_MAX_DELIVERY_ATTEMPTS] == '5'
    assert data[broker.ENV_DEAD_LETTER_ADDRESS] == 'DLQ'
    assert data[broker.ENV_HANDOVER] == 'false'
    assert broker.BrokerSettings.from_env(data).routing.handover is False
    assert data[broker.ENV_DELIVER_AHEAD] == 'false'
    assert broker.BrokerSettings.from_env(data).routing.deliver_ahead is False
    assert broker.BrokerSettings.from_env(data).routing.exclusive_addresses == ('orders.*', 'fx')
    assert broker.ENV_AUTO_CREATE_TOPICS not in data
    assert broker.ENV_DECLARED_SUBSCRIPTIONS_ONLY not in data
    detecting = config.configmap(model(broker={
        'duplicateDetection': True, 'duplicateWindow': 500, 'duplicateWindowSeconds': 60,
        'duplicateIdProperty': '_AMQ_DUPL_ID'}))['data']  # fmt: skip
    duplicates = broker.BrokerSettings.from_env(detecting).duplicates
    assert duplicates == broker.DuplicateSettings(
        enabled=True, window=500, window_seconds=60, id_property='_AMQ_DUPL_ID'
    )
    last_values = {'lastValueAddresses': 'prices.*,devices', 'lastValueProperty': 'device'}
    last = config.configmap(model(broker=last_values))['data']
    assert broker.BrokerSettings.from_env(last).last_values == broker.LastValueSettings(
        addresses=('prices.*', 'devices'), key_property='device'
    )
    denying = config.configmap(model(subscriptions={'undeclared': 'Deny'}))['data']
    assert denying[broker.ENV_DECLARED_SUBSCRIPTIONS_ONLY] == 'true'


def test_the_metrics_interval_and_heartbeat_reach_the_brokers_settings() -> None:
    data = config.configmap(
        model(broker={'metricsIntervalSeconds': 5, 'metricsHeartbeatSeconds': 20})
    )['data']
    assert data[broker.ENV_METRICS_INTERVAL] == '5'
    assert data[broker.ENV_METRICS_HEARTBEAT] == '20'
    store = broker.BrokerSettings.from_env(data).store
    assert (store.metrics_interval_seconds, store.metrics_heartbeat_seconds) == (5.0, 20.0)
    # unset, the brokers keep their own default: the ConfigMap names no heartbeat
    unset = config.configmap(model(broker={'metricsIntervalSeconds': 5}))['data']
    assert broker.ENV_METRICS_HEARTBEAT not in unset
    default = broker.BrokerSettings().store.metrics_heartbeat_seconds
    assert broker.BrokerSettings.from_env(unset).store.metrics_heartbeat_seconds == default


def test_the_connection_drain_reaches_the_brokers_and_the_pods_grace_period() -> None:
    drained = model(scaleDown={'drainSeconds': 7, 'connectionDrainSeconds': 4})
    data = config.configmap(drained)['data']
    assert data[broker.ENV_DRAIN] == '4'
    assert broker.BrokerSettings.from_env(data).connection_drain_seconds == 4.0
    pod = workload.deployment(drained)['spec']['template']['spec']
    assert pod['terminationGracePeriodSeconds'] == 7 + 4 + 20 + 5
    # unset, the brokers keep their own default (inside the shutdown grace): nothing is added
    unset = model(scaleDown={'drainSeconds': 7})
    assert broker.ENV_DRAIN not in config.configmap(unset)['data']
    default = broker.BrokerSettings().connection_drain_seconds
    assert default < unset.shutdown_grace_seconds
    assert broker.BrokerSettings.from_env({}).connection_drain_seconds == default
    assert template_checksum(unset) != template_checksum(drained)


def test_tracing_reaches_the_brokers_settings_and_the_sdks_endpoint() -> None:
    tracing = {'enabled': True, 'sampleRatio': 0.01, 'otlpEndpoint': 'http://otel:4318'}
    data = config.configmap(model(broker={'tracing': tracing}))['data']
    assert data['OTEL_EXPORTER_OTLP_ENDPOINT'] == 'http://otel:4318'
    settings = broker.BrokerSettings.from_env(data).tracing
    assert (settings.enabled, settings.sample_ratio) == (True, 0.01)
    # unset, nothing is rendered and the brokers keep their defaults: tracing off
    unset = config.configmap(model(broker={'tracing': {}}))['data']
    assert not {broker.ENV_TRACING, broker.ENV_TRACING_SAMPLE_RATIO} & unset.keys()
    assert broker.BrokerSettings.from_env(unset).tracing == broker.TracingSettings()


def test_a_cluster_written_before_a_setting_existed_keeps_its_configmap_and_pod_template() -> None:
    """Upgrading the operator must not roll the pods of existing clusters: a spec that does
    not name a newer setting renders the ConfigMap, and so the pod template's checksum, it
    rendered before that setting existed (the digest below is the one those releases wrote)."""
    earlier = model(broker={'metricsIntervalSeconds': 10, 'logLevel': 'INFO'})
    assert config.settings_env(earlier) == {
        broker.ENV_LISTEN: '0.0.0.0:5672',
        broker.ENV_HTTP: '0.0.0.0:8080',
        broker.ENV_DURABILITY: 'memory',
        broker.ENV_LOG_FORMAT: 'json',
        broker.ENV_SHUTDOWN_GRACE: '20',
        broker.ENV_METRICS_INTERVAL: '10',
        broker.ENV_LOG_LEVEL: 'INFO',
    }
    assert template_checksum(earlier) == (
        '798b8e34b923bf69d566ed9691e4da66331a11dc0a56e7432aa303ea64c04ae3'
    )


def test_the_store_hold_reaches_the_brokers_settings_and_unset_changes_nothing() -> None:
    data = config.configmap(model(broker={'storeHoldSeconds': 60}))['data']
    assert data[broker.ENV_STORE_HOLD] == '60'
    assert broker.BrokerSettings.from_env(data).store.hold_seconds == 60.0
    # unset, the brokers keep their own default and an earlier cluster its pod template
    earlier = model(broker={'metricsIntervalSeconds': 10, 'logLevel': 'INFO'})
    assert broker.ENV_STORE_HOLD not in config.configmap(earlier)['data']
    assert template_checksum(earlier) == (
        '798b8e34b923bf69d566ed9691e4da66331a11dc0a56e7432aa303ea64c04ae3'
    )
    assert broker.BrokerSettings().store.hold_seconds >= 30


def template_checksum(cluster: BrokerCluster) -> str:
    checksum: str = workload.deployment(cluster)['spec']['template']['metadata']['annotations'][
        config.CONFIG_CHECKSUM
    ]
    return checksum


def test_the_pod_template_changes_with_the_broker_settings_and_only_with_them() -> None:
    settings = {'logLevel': 'DEBUG', 'maxDeliveryAttempts': 5, 'autoCreateTopics': False}
    base = template_checksum(model(broker=settings))
    assert base == template_checksum(model(broker=dict(reversed(settings.items()))))
    assert re.fullmatch('[0-9a-f]{64}', base)  # a SHA-256 digest
    # what does not reach the ConfigMap leaves the template's checksum alone
    assert base == template_checksum(model(broker=settings, replicas=7,
                                           podTemplate={'annotations': {'note': 'y'}},
                                           resources={'limits': {'cpu': 1}}))  # fmt: skip
    assert base == template_checksum(model(broker={**settings, 'unknownField': 1}))
    # every setting the ConfigMap carries changes it
    changed = [
        model(broker={**settings, 'logLevel': 'INFO'}),
        model(broker={**settings, 'maxDeliveryAttempts': 6}),
        model(broker={**settings, 'metricsHeartbeatSeconds': 20}),
        model(broker={**settings, 'storeHoldSeconds': 60}),
        model(broker={**settings, 'tracing': {'enabled': True}}),
        model(broker={key: v for key, v in settings.items() if key != 'autoCreateTopics'}),
        model(broker=settings, durability='fsync'),
        model(broker=settings, subscriptions={'undeclared': 'Deny'}),
    ]
    assert len({base, *map(template_checksum, changed)}) == 1 + len(changed)
    # a pod template annotation cannot stand in for the checksum
    forged = model(broker=settings, podTemplate={'annotations': {config.CONFIG_CHECKSUM: 'x'}})
    assert template_checksum(forged) == base


def applied_then(before: BrokerCluster, after: BrokerCluster, build: Any) -> dict[str, Any]:
    """The merge patch the operator sends when ``after`` replaces ``before`` on a live object
    that someone else also labelled (the live object is what ``before`` applied, plus that)."""
    live = applied.recording(build(before))
    live['metadata']['labels'] = {**live['metadata']['labels'], 'others': 'x'}
    patch: dict[str, Any] = applied.removing_dropped(live, applied.recording(build(after)))
    return patch


def test_a_key_an_earlier_apply_set_is_removed_when_the_spec_drops_it_and_only_then() -> None:
    before = model(
        podTemplate={'labels': {'team': 'a', 'tier': 'b'}, 'annotations': {'note': 'y'},
                     'nodeSelector': {'disk': 'ssd', 'zone': 'z1'}, 'priorityClassName': 'high',
                     'affinity': {'nodeAffinity': {'requiredDuringScheduling': {'t': [1]}}}},
        service={'annotations': {'lb': 'internal'}},
    )  # fmt: skip
    after = model(podTemplate={'labels': {'tier': 'b'}, 'nodeSelector': {'zone': 'z1'}})
    template = applied_then(before, after, workload.deployment)['spec']['template']
    assert template['metadata']['labels']['team'] is None
    assert template['metadata']['labels']['tier'] == 'b'
    assert template['metadata']['annotations']['note'] is None
    assert template['metadata']['annotations'][config.CONFIG_CHECKSUM] is not None
    assert template['spec']['nodeSelector'] == {'disk': None, 'zone': 'z1'}
    assert template['spec']['priorityClassName'] is None
    # back to the default anti-affinity: the user's node affinity goes
    assert template['spec']['affinity']['nodeAffinity'] is None
    assert template['spec']['affinity']['podAntiAffinity']
    service = applied_then(before, after, network.service)
    assert service['metadata']['annotations']['lb'] is None
    # an unchanged spec removes nothing, and a key the operator never set is never touched
    for build in (workload.deployment, network.service, config.configmap):
        same = applied_then(before, before, build)
        assert same == applied.recording(build(before))
        assert 'others' not in applied_then(before, after, build)['metadata']['labels']


def test_a_missing_or_foreign_record_removes_nothing() -> None:
    desired = applied.recording(workload.deployment(model()))
    tagged = model(podTemplate={'labels': {'team': 'a'}})
    live = workload.deployment(tagged)  # made by an operator that kept no record
    assert applied.removing_dropped(live, desired) == desired
    for record in ('not json', '[1, 2]', '"labels"'):
        live['metadata']['annotations'] = {applied.LAST_APPLIED_KEYS: record}
        assert applied.removing_dropped(live, desired) == desired
    # the record names keys, never values (a Secret's data is not copied into its metadata)
    secret = applied.recording(config.connection_secret(model()))
    record = secret['metadata']['annotations'][applied.LAST_APPLIED_KEYS]
    assert all(value not in record for value in secret['data'].values())


def test_the_connection_secret_tells_apps_where_to_connect() -> None:
    secret = config.connection_secret(model())
    decoded = {k: base64.b64decode(v).decode() for k, v in secret['data'].items()}
    assert decoded['uri'] == 'amqp://shoal.msg.svc:5672'
    assert (decoded['host'], decoded['port'], decoded['type']) == ('shoal.msg.svc', '5672', 'amqp')
    assert secret['metadata']['name'] == 'shoal-connection'


def test_services_select_the_broker_pods() -> None:
    service = network.service(model(service={'type': 'LoadBalancer', 'annotations': {'a': 'b'}}))
    assert service['spec']['type'] == 'LoadBalancer'
    assert service['metadata']['annotations'] == {'a': 'b'}
    assert service['spec']['selector'] == naming.labels(model())
    headless = network.headless_service(model())
    assert headless['spec']['clusterIP'] == 'None'
    assert headless['metadata']['name'] == 'shoal-pods'


def test_the_pdb_keeps_all_but_max_unavailable_replicas() -> None:
    pdb = workload.pod_disruption_budget(model(pdb={'maxUnavailable': 2}))
    assert pdb['spec']['maxUnavailable'] == 2
    assert pdb['spec']['selector']['matchLabels'] == naming.labels(model())


def test_the_network_policy_admits_amqp_only_from_the_listed_peers() -> None:
    assert network.network_policy(model()) is None
    peers = [{'podSelector': {'matchLabels': {'client': 'yes'}}}]
    policy = network.network_policy(model(networkPolicy={'enabled': True, 'from': peers}))
    assert policy is not None
    amqp, http = policy['spec']['ingress']
    assert amqp == {'from': peers, 'ports': [{'protocol': 'TCP', 'port': 5672}]}
    assert http == {'ports': [{'protocol': 'TCP', 'port': 8080}]}
    everyone = network.network_policy(model(networkPolicy={'enabled': True}))
    assert everyone is not None
    assert everyone['spec']['ingress'][0]['from'] == [{'podSelector': {}}]


def test_the_service_monitor_scrapes_the_metrics_port_when_enabled() -> None:
    assert network.service_monitor(model()) is None
    monitor = network.service_monitor(model(metrics={'serviceMonitor': {
        'enabled': True, 'interval': '15s', 'labels': {'release': 'prom'}}}))  # fmt: skip
    assert monitor is not None
    assert monitor['spec']['endpoints'] == [{'port': 'http', 'path': '/metrics', 'interval': '15s'}]
    assert monitor['metadata']['labels']['release'] == 'prom'


def test_build_all_orders_config_first_and_names_what_is_switched_off() -> None:
    kinds = [m['kind'] for m in manifests.build_all(model())]
    assert kinds == ['ConfigMap', 'Secret', 'Deployment', 'Service', 'Service',
                     'PodDisruptionBudget']  # fmt: skip
    assert [k for _, k, _ in manifests.switched_off(model())] == [
        'NetworkPolicy', 'ServiceMonitor', 'HorizontalPodAutoscaler']  # fmt: skip
    everything = model(
        networkPolicy={'enabled': True}, metrics={'serviceMonitor': {'enabled': True}},
        autoscaling={'enabled': True},
    )  # fmt: skip
    assert len(manifests.build_all(everything)) == 9
    assert manifests.switched_off(everything) == []
    for manifest in manifests.build_all(everything):
        assert manifest['metadata']['namespace'] == 'msg'
        assert manifest['metadata']['labels']['app.kubernetes.io/managed-by'] == 'shoal-operator'


def test_a_cluster_without_redis_or_with_inverted_bounds_is_invalid() -> None:
    with pytest.raises(InvalidSpec, match='secretName'):
        BrokerCluster.from_body({'metadata': {'name': 'x'}, 'spec': {}}, default_image='i')
    with pytest.raises(InvalidSpec, match='minReplicas'):
        model(autoscaling={'minReplicas': 5, 'maxReplicas': 2})
    assert model(image='mine:2').image == 'mine:2'
    assert model().admits('msg')
    assert not model().admits('other')
    assert model(tenancy={'allowedNamespaces': ['other']}).admits('other')


def test_a_cluster_is_closed_to_anonymous_clients_unless_its_spec_opens_it() -> None:
    with pytest.raises(InvalidSpec, match='usersSecretName is required'):
        model(auth={})
    with pytest.raises(InvalidSpec, match='usersSecretName is required'):
        BrokerCluster.from_body({'spec': {'redis': {'secretName': 'r'}}}, default_image='i')
    closed = model(auth={'usersSecretName': 'users'})
    assert (closed.auth.allow_anonymous, closed.auth.users_secret) == (False, 'users')
    assert model().auth.allow_anonymous


def test_users_come_from_a_read_only_secret_volume_the_broker_rereads() -> None:
    d = workload.deployment(model(auth={'usersSecretName': 'shoal-users'}))
    pod = d['spec']['template']['spec']
    [container] = pod['containers']
    env = {e['name']: e.get('value') for e in container['env']}
    assert env[broker.ENV_ALLOW_ANONYMOUS] == 'false'
    assert env[broker.ENV_USERS_FILE] == '/etc/shoal/users/users.json'
    assert broker.ENV_TLS_LISTEN not in env
    assert {'name': 'users', 'mountPath': '/etc/shoal/users', 'readOnly': True} in (
        container['volumeMounts']
    )
    assert not any('subPath' in m for m in container['volumeMounts'])  # would freeze the file
    assert {'name': 'users', 'secret': {
        'secretName': 'shoal-users', 'items': [{'key': 'users.json', 'path': 'users.json'}],
        'defaultMode': 0o440}} in pod['volumes']  # fmt: skip
    anonymous = workload.deployment(model(auth={'allowAnonymous': True}))['spec']['template']
    [container] = anonymous['spec']['containers']
    env = {e['name']: e.get('value') for e in container['env']}
    assert env[broker.ENV_ALLOW_ANONYMOUS] == 'true'
    assert broker.ENV_USERS_FILE not in env
    assert [v['name'] for v in anonymous['spec']['volumes']] == ['tmp', 'management']


TLS = {'secretName': 'shoal-tls', 'clientAuth': 'Required', 'clientCASecretName': 'clients'}


def test_the_secrets_the_pods_mount_are_checked_for_existence_and_keys() -> None:
    cluster = model(auth={'usersSecretName': 'shoal-users'}, tls=TLS)
    assert [(m.secret, m.keys) for m in security.secret_mounts(cluster)] == [
        ('shoal-users', ('users.json',)), ('shoal-tls', ('tls.crt', 'tls.key')),
        ('clients', ('ca.crt',)),
    ]  # fmt: skip
    complete = {'shoal-users': {'users.json'}, 'shoal-tls': {'tls.crt', 'tls.key', 'ca.crt'},
                'clients': {'ca.crt'}}  # fmt: skip
    assert security.secret_problems(cluster, complete) == []
    partial = {'shoal-users': None, 'shoal-tls': {'ca.crt'}, 'clients': {'ca.crt'}}
    assert security.secret_problems(cluster, partial) == [
        ('SecretMissing', 'Secret msg/shoal-users (spec.auth.usersSecretName) does not exist'),
        ('SecretKeyMissing',
         'Secret msg/shoal-tls (spec.tls.secretName) has no key tls.crt, tls.key'),
    ]  # fmt: skip
    assert security.secret_problems(cluster, {})[2] == (
        'SecretMissing', 'Secret msg/clients (spec.tls.clientCASecretName) does not exist'
    )  # fmt: skip
    assert security.secret_mounts(model()) == []


def test_tls_adds_an_amqps_listener_on_the_mounted_certificates() -> None:
    pod = workload.deployment(model(tls=TLS))['spec']['template']['spec']
    [container] = pod['containers']
    env = {e['name']: e.get('value') for e in container['env']}
    assert env[broker.ENV_TLS_LISTEN] == '0.0.0.0:5671'
    assert env[broker.ENV_TLS_CERT_FILE] == '/etc/shoal/tls/tls.crt'
    assert env[broker.ENV_TLS_KEY_FILE] == '/etc/shoal/tls/tls.key'
    assert env[broker.ENV_TLS_CLIENT_CA_FILE] == '/etc/shoal/client-ca/ca.crt'
    assert broker.ClientAuth(env[broker.ENV_TLS_CLIENT_AUTH]) is broker.ClientAuth.REQUIRED
    assert {p['name']: p['containerPort'] for p in container['ports']} == {
        'amqp': 5672, 'http': 8080, 'amqps': 5671}  # fmt: skip
    volumes = {v['name']: v['secret'] for v in pod['volumes'] if 'secret' in v}
    assert volumes['tls']['secretName'] == 'shoal-tls'
    assert [i['key'] for i in volumes['tls']['items']] == ['tls.crt', 'tls.key']
    assert volumes['client-ca']['secretName'] == 'clients'
    mounts = {m['name']: m['mountPath'] for m in container['volumeMounts'] if m.get('readOnly')}
    assert mounts == {
        'tls': '/etc/shoal/tls', 'client-ca': '/etc/shoal/client-ca',
        'management': '/etc/shoal/management',
    }  # fmt: skip
    assert container['readinessProbe']['httpGet'] == {'path': '/readyz', 'port': 'http'}
    server_only = workload.deployment(model(tls={'secretName': 'shoal-tls'}))
    [container] = server_only['spec']['template']['spec']['containers']
    env = {e['name']: e.get('value') for e in container['env']}
    assert env[broker.ENV_TLS_CLIENT_AUTH] == 'none'
    assert broker.ENV_TLS_CLIENT_CA_FILE not in env


def test_tls_opens_amqps_on_the_services_the_policy_and_the_connection_secret() -> None:
    cluster = model(tls={'secretName': 'shoal-tls'}, networkPolicy={'enabled': True})
    for service in (network.service(cluster), network.headless_service(cluster)):
        assert {'name': 'amqps', 'port': 5671, 'targetPort': 'amqps', 'protocol': 'TCP'} in (
            service['spec']['ports']
        )
    assert 'amqps' not in [p['name'] for p in network.service(model())['spec']['ports']]
    policy = network.network_policy(cluster)
    assert policy is not None
    assert policy['spec']['ingress'][0]['ports'] == [
        {'protocol': 'TCP', 'port': 5672}, {'protocol': 'TCP', 'port': 5671}]  # fmt: skip
    secret = config.connection_secret(cluster)
    decoded = {k: base64.b64decode(v).decode() for k, v in secret['data'].items()}
    assert decoded['uri'] == 'amqp://shoal.msg.svc:5672'
    assert decoded['amqps-uri'] == 'amqps://shoal.msg.svc:5671'
    assert decoded['amqps-port'] == '5671'
    plain = config.connection_details(model())
    assert 'amqps-uri' not in plain


@pytest.mark.parametrize(('tls', 'message'), [
    ({}, 'tls.secretName is required'),
    ({'secretName': 's', 'clientAuth': 'Optional'}, 'clientCASecretName is required'),
    ({'secretName': 's', 'clientAuth': 'Sometimes'}, 'must be None, Optional or Required'),
])  # fmt: skip
def test_an_incomplete_tls_spec_is_invalid(tls: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpec, match=message):
        model(tls=tls)
