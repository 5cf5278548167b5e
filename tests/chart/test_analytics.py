"""
The scheduled Spark analytics job in the chart: off by default; a CronJob running Spark in local
mode, or a ScheduledSparkApplication for the Kubeflow Spark Operator; the driver's RBAC; the
NetworkPolicy caveat of Spark on Kubernetes (driver <-> executor, Redis, API server).
"""

import shlex
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chartrender import Manifest, container, env, find, one, render
from crdcheck import oldest_kubernetes
from podsecurity import restricted_violations

ANALYTICS_KINDS = {'CronJob', 'ScheduledSparkApplication', 'PersistentVolumeClaim'}
JOB_SCRIPT = '/opt/shoal/analytics-job.py'


def cronjob_pod(manifests: list[Manifest]) -> dict[str, Any]:
    pod: dict[str, Any] = one(manifests, 'CronJob')['spec']['jobTemplate']['spec']['template']
    return pod


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_off_by_default() -> None:
    kinds = {m['kind'] for m in render()}
    assert kinds.isdisjoint(ANALYTICS_KINDS)
    assert 'rel-shoal-analytics' not in {m['metadata']['name'] for m in render()}


def test_cronjob_runs_ingest_then_analyze_in_local_mode_without_overlap() -> None:
    manifests = render({'analytics': {'enabled': True}})
    cronjob = one(manifests, 'CronJob')
    assert cronjob['spec']['concurrencyPolicy'] == 'Forbid'
    assert cronjob['spec']['schedule'] == '*/15 * * * *'
    pod = cronjob_pod(manifests)['spec']
    job = container(pod, 'analytics')
    assert job['image'] == 'ghcr.io/shoal-dev/shoal-analytics:0.1.0'
    assert 'command' not in job  # the image's entrypoint (tini) stays
    assert job['args'] == ['python', JOB_SCRIPT]
    variables = env(job)
    assert variables['SPARK_MASTER'] == 'local[2]'
    submit = shlex.split(variables['PYSPARK_SUBMIT_ARGS'])
    assert submit[:2] == ['--driver-memory', '1g']
    assert submit[-1] == 'pyspark-shell'
    assert 'spark.sql.shuffle.partitions=8' in submit
    assert variables['SHOAL_REDIS_URL'] == {
        'secretKeyRef': {'name': 'rel-shoal-redis', 'key': 'url'}
    }
    assert variables['SHOAL_ANALYTICS_LAKE'] == '/data/lake'
    assert variables['SHOAL_ANALYTICS_CAPACITY_PER_REPLICA'] == '2000'
    # Local mode needs no Kubernetes API: no token, no Role.
    assert pod['automountServiceAccountToken'] is False
    assert find(manifests, 'Role', 'rel-shoal-spark-driver') == []
    claim = one(manifests, 'PersistentVolumeClaim')
    assert {'name': 'lake', 'persistentVolumeClaim': {'claimName': claim['metadata']['name']}} in (
        pod['volumes']
    )
    assert claim['metadata']['annotations']['helm.sh/resource-policy'] == 'keep'


def test_user_spark_conf_wins_over_the_defaults_and_is_quoted() -> None:
    spark_conf = {
        'spark.sql.shuffle.partitions': '4',
        'spark.driver.extraJavaOptions': '-Da=1 -Db=2',
    }
    values = {'analytics': {'enabled': True, 'sparkConf': spark_conf}}
    submit = shlex.split(
        env(container(cronjob_pod(render(values))['spec'], 'analytics'))['PYSPARK_SUBMIT_ARGS']
    )
    assert 'spark.sql.shuffle.partitions=4' in submit
    assert 'spark.sql.shuffle.partitions=8' not in submit
    assert 'spark.driver.extraJavaOptions=-Da=1 -Db=2' in submit


def test_spark_operator_application_runs_the_same_script_as_driver() -> None:
    manifests = render({'analytics': {'enabled': True, 'runner': 'sparkOperator'}})
    assert find(manifests, 'CronJob') == []
    app = one(manifests, 'ScheduledSparkApplication')
    assert app['spec']['concurrencyPolicy'] == 'Forbid'
    template = app['spec']['template']
    assert (template['type'], template['mode']) == ('Python', 'cluster')
    assert template['mainApplicationFile'] == f'local://{JOB_SCRIPT}'
    assert template['sparkVersion'] == '4.3.0'
    assert template['sparkConf']['spark.kubernetes.driver.pod.excludedFeatureSteps'] == (
        'org.apache.spark.deploy.k8s.features.NetworkPolicyFeatureStep'
    )
    driver_env = env(template['driver'])
    assert driver_env['SPARK_MASTER'].startswith('k8s://https://kubernetes.default.svc')
    assert driver_env['SHOAL_REDIS_URL'] == {
        'secretKeyRef': {'name': 'rel-shoal-redis', 'key': 'url'}
    }
    for pod in (template['driver'], template['executor']):
        assert {'name': 'lake', 'mountPath': '/data/lake'} in pod['volumeMounts']
        assert pod['podSecurityContext']['runAsUser'] == 185


def test_spark_driver_may_manage_its_executors_and_nothing_more() -> None:
    """The verbs themselves are held to a real driver's requests in tests/k8s/test_spark_submit.py;
    here, that both Kubernetes runners bind the same Role to the driver's ServiceAccount."""
    for runner in ('sparkOperator', 'sparkSubmit'):
        manifests = render({'analytics': {'enabled': True, 'runner': runner}})
        account = one(manifests, 'ServiceAccount', 'rel-shoal-analytics')
        assert account['automountServiceAccountToken'] is True
        role = one(manifests, 'Role', 'rel-shoal-spark-driver')
        resources = {r for rule in role['rules'] for r in rule['resources']}
        assert resources == {'pods', 'configmaps', 'services'}  # no PVCs: the lake is a claim
        assert all(rule['apiGroups'] == [''] for rule in role['rules'])
        binding = one(manifests, 'RoleBinding', 'rel-shoal-spark-driver')
        assert binding['subjects'][0]['name'] == 'rel-shoal-analytics'
    app = one(render({'analytics': {'enabled': True, 'runner': 'sparkOperator'}}),
              'ScheduledSparkApplication')  # fmt: skip
    assert app['spec']['template']['driver']['serviceAccount'] == 'rel-shoal-analytics'


def spark_submit_args(manifests: list[Manifest]) -> list[str]:
    args: list[str] = container(cronjob_pod(manifests)['spec'], 'spark-submit')['args']
    return args


def pod_templates(manifests: list[Manifest]) -> dict[str, dict[str, Any]]:
    data = one(manifests, 'ConfigMap', 'rel-shoal-spark-pod-templates')['data']
    return {name: yaml.safe_load(text) for name, text in data.items()}


def test_spark_submit_runs_the_job_in_cluster_mode_with_its_own_identity_and_templates() -> None:
    manifests = render({'analytics': {'enabled': True, 'runner': 'sparkSubmit'}})
    assert find(manifests, 'ScheduledSparkApplication') == []
    pod = cronjob_pod(manifests)['spec']
    assert pod['serviceAccountName'] == 'rel-shoal-spark-submit'
    args = spark_submit_args(manifests)
    assert args[:5] == ['spark-submit', '--master', 'k8s://https://kubernetes.default.svc:443',
                        '--deploy-mode', 'cluster']  # fmt: skip
    assert args[-1] == f'local://{JOB_SCRIPT}'
    conf = dict(a.split('=', 1) for a in args[args.index('--conf') + 1 : -1 : 2])
    assert conf['spark.kubernetes.authenticate.driver.serviceAccountName'] == 'rel-shoal-analytics'
    assert conf['spark.kubernetes.submission.waitAppCompletion'] == 'true'  # Forbid means it
    assert conf['spark.kubernetes.driver.pod.excludedFeatureSteps'].endswith(
        'NetworkPolicyFeatureStep'
    )
    assert conf['spark.kubernetes.driver.ownPersistentVolumeClaim'] == 'false'
    assert conf['spark.sql.shuffle.partitions'] == '8'
    assert conf['spark.kubernetes.driver.podTemplateFile'] == '/opt/shoal/pod-templates/driver.yaml'
    mounts = container(pod, 'spark-submit')['volumeMounts']
    assert {'name': 'pod-templates', 'mountPath': '/opt/shoal/pod-templates', 'readOnly': True} in (
        mounts
    )
    templates = pod_templates(manifests)
    (driver,) = templates['driver.yaml']['spec']['containers']
    assert env(driver)['SHOAL_REDIS_URL'] == {
        'secretKeyRef': {'name': 'rel-shoal-redis', 'key': 'url'}
    }
    for template in templates.values():
        (each,) = template['spec']['containers']
        assert {'name': 'lake', 'mountPath': '/data/lake'} in each['volumeMounts']
    submitter = one(manifests, 'Role', 'rel-shoal-spark-submit')
    assert one(manifests, 'RoleBinding', 'rel-shoal-spark-submit')['subjects'][0]['name'] == (
        'rel-shoal-spark-submit'
    )
    assert {r for rule in submitter['rules'] for r in rule['resources']} == {
        'pods', 'services', 'configmaps'
    }  # fmt: skip


def pod_errors(pod: Manifest) -> list[str]:
    """Why the API server of the oldest supported Kubernetes or of 1.30 would refuse ``pod``."""
    errors = []
    for version in (oldest_kubernetes(), '1.30.0'):
        try:
            kubernetes_validate.validate(pod, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f'{version} {list(error.path)}: {error.message}')
    return errors


def test_spark_submit_pod_templates_are_valid_pods() -> None:
    manifests = render({'analytics': {'enabled': True, 'runner': 'sparkSubmit'},
                        'imagePullSecrets': [{'name': 'registry'}]})  # fmt: skip
    for name, template in pod_templates(manifests).items():
        template['metadata']['name'] = name.removesuffix('.yaml')
        assert pod_errors(template) == [], name
        assert template['spec']['imagePullSecrets'] == [{'name': 'registry'}]
    broken = pod_templates(manifests)['driver.yaml']
    broken['metadata']['name'] = 'driver'
    broken['spec']['containers'][0]['volumeMounts'] = 'lake'
    assert pod_errors(broken)  # the check can fail


@pytest.mark.parametrize('runner', ['cronJob', 'sparkOperator', 'sparkSubmit'])
def test_every_runner_passes_pod_security_restricted(runner: str) -> None:
    """docs/analytics.md: every runner's pods are admitted under PodSecurity "restricted" (for
    sparkOperator, as far as the application's driver and executor specs decide it)."""
    manifests = render({'analytics': {'enabled': True, 'runner': runner}})
    specs: list[dict[str, Any]] = []
    if runner != 'sparkOperator':
        specs.append(cronjob_pod(manifests)['spec'])
    if runner == 'sparkSubmit':
        specs += [t['spec'] for t in pod_templates(manifests).values()]
    if runner == 'sparkOperator':
        template = one(manifests, 'ScheduledSparkApplication')['spec']['template']
        for role in ('driver', 'executor'):
            spec = template[role]
            specs.append({'securityContext': spec['podSecurityContext'], 'containers': [
                {'name': role, 'securityContext': spec['securityContext']}]})  # fmt: skip
    for spec in specs:
        assert restricted_violations(spec) == []
    loose = {**specs[0], 'containers': [{**specs[0]['containers'][0], 'securityContext': {}}]}
    assert restricted_violations(loose)  # the check can fail


def network_policy(manifests: list[Manifest], name: str) -> Manifest:
    return one(manifests, 'NetworkPolicy', name)


def egress_to_pods(policy: Manifest, labels: dict[str, str], port: int | None = None) -> bool:
    for rule in policy['spec']['egress']:
        ports = {p['port'] for p in rule.get('ports', [])}
        for peer in rule.get('to', []):
            selector = peer.get('podSelector', {}).get('matchLabels')
            reaches_port = port is None or not ports or port in ports
            if selector is not None and matches(selector, labels) and reaches_port:
                return True
    return False


def test_network_policy_lets_driver_and_executors_talk_and_reach_redis() -> None:
    manifests = render(
        {
            'networkPolicy': {'enabled': True},
            'analytics': {'enabled': True, 'runner': 'sparkOperator'},
        }
    )
    policy = network_policy(manifests, 'rel-shoal-analytics')
    template = one(manifests, 'ScheduledSparkApplication')['spec']['template']
    selector = policy['spec']['podSelector']['matchLabels']
    for pod in (template['driver'], template['executor']):
        labels = pod['labels']
        assert matches(selector, labels)  # the policy applies to both
        (ingress,) = policy['spec']['ingress']
        assert any(matches(p['podSelector']['matchLabels'], labels) for p in ingress['from'])
        assert egress_to_pods(policy, labels)
    redis_pod = one(manifests, 'StatefulSet')['spec']['template']['metadata']['labels']
    assert egress_to_pods(policy, redis_pod, 6379)
    # The driver creates its executors through the API server.
    assert any(
        {p['port'] for p in rule.get('ports', [])} == {443, 6443}
        for rule in policy['spec']['egress']
    )
    # And Redis lets in this namespace's pods (the job, brokers, operator).
    redis_policy = network_policy(manifests, 'rel-shoal-redis')
    assert matches(redis_policy['spec']['podSelector']['matchLabels'], redis_pod)
    assert redis_policy['spec']['ingress'][0]['from'] == [{'podSelector': {}}]


def test_network_policy_for_local_mode_has_no_api_server_egress() -> None:
    manifests = render({'networkPolicy': {'enabled': True}, 'analytics': {'enabled': True}})
    policy = network_policy(manifests, 'rel-shoal-analytics')
    pod_labels = cronjob_pod(manifests)['metadata']['labels']
    assert matches(policy['spec']['podSelector']['matchLabels'], pod_labels)
    assert all(
        not {p['port'] for p in rule.get('ports', [])} & {443, 6443}
        for rule in policy['spec']['egress']
    )


def test_network_policy_with_existing_redis_allows_its_cidr() -> None:
    values = {
        'networkPolicy': {
            'enabled': True,
            'externalRedis': {'cidrs': ['10.9.0.0/16'], 'port': 6380},
        },
        'analytics': {'enabled': True},
        'redis': {'enabled': False, 'existingSecret': {'name': 'corp-redis'}},
    }
    manifests = render(values)
    assert find(manifests, 'NetworkPolicy', 'rel-shoal-redis') == []
    for name in ('rel-shoal-analytics', 'rel-shoal-operator'):
        rules = network_policy(manifests, name)['spec']['egress']
        assert {'to': [{'ipBlock': {'cidr': '10.9.0.0/16'}}], 'ports': [
            {'port': 6380, 'protocol': 'TCP'}]} in rules  # fmt: skip


def test_operator_network_policy_reaches_api_server_and_redis() -> None:
    manifests = render({'networkPolicy': {'enabled': True}})
    policy = network_policy(manifests, 'rel-shoal-operator')
    operator_labels = one(manifests, 'Deployment')['spec']['template']['metadata']['labels']
    assert matches(policy['spec']['podSelector']['matchLabels'], operator_labels)
    redis_pod = one(manifests, 'StatefulSet')['spec']['template']['metadata']['labels']
    assert egress_to_pods(policy, redis_pod, 6379)
    external = {
        'to': [{'ipBlock': {'cidr': '0.0.0.0/0'}}],
        'ports': [{'port': 6379, 'protocol': 'TCP'}],
    }
    assert external in policy['spec']['egress']  # other clusters' Redis
    ingress_ports = {p['port'] for rule in policy['spec']['ingress'] for p in rule['ports']}
    assert ingress_ports == {8080, 9090}
