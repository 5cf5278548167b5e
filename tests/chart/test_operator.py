"""
The operator as the chart installs it: the process contract (command, env, ports, probes), and
RBAC that is exactly the agreed list (contracts.md), namespaced or cluster-wide.
"""

from typing import Any

from chartrender import NAMESPACE, Manifest, container, env, find, one, render

# The operator's needs, exactly the requests it makes (tests/k8s/test_operator_rbac.py records
# them in the emulator): (api group, resource) -> verbs. Nothing at cluster scope: it never lists
# namespaces or CRDs. brokerclusters/finalizers: the children's blockOwnerDeletion.
CHILD = {'get', 'create', 'patch'}
NAMESPACED_NEEDS: dict[tuple[str, str], set[str]] = {
    ('shoal.dev', 'brokerclusters'): {'get', 'list', 'watch', 'patch'},
    ('shoal.dev', 'sharedsubscriptions'): {'get', 'list', 'watch', 'patch'},
    ('shoal.dev', 'queues'): {'get', 'list', 'watch', 'patch'},
    **{('shoal.dev', f'{kind}/status'): {'patch'}
       for kind in ('brokerclusters', 'queues', 'sharedsubscriptions')},
    ('shoal.dev', 'brokerclusters/finalizers'): {'update'},
    ('apps', 'deployments'): CHILD,
    ('', 'services'): CHILD,
    ('', 'configmaps'): CHILD,
    ('', 'secrets'): CHILD,
    ('policy', 'poddisruptionbudgets'): CHILD,
    ('networking.k8s.io', 'networkpolicies'): CHILD | {'delete'},
    ('monitoring.coreos.com', 'servicemonitors'): CHILD | {'delete'},
    ('autoscaling', 'horizontalpodautoscalers'): CHILD | {'delete'},
    ('', 'events'): {'create'},
}  # fmt: skip


def granted(role: Manifest) -> dict[tuple[str, str], set[str]]:
    grants: dict[tuple[str, str], set[str]] = {}
    for rule in role['rules']:
        assert 'resourceNames' not in rule
        assert '*' not in rule['verbs']
        for group in rule['apiGroups']:
            for resource in rule['resources']:
                grants.setdefault((group, resource), set()).update(rule['verbs'])
    return grants


def operator_container(manifests: list[Manifest]) -> dict[str, Any]:
    deployment = one(manifests, 'Deployment', 'rel-shoal-operator')
    return container(deployment['spec']['template']['spec'], 'operator')


def test_operator_runs_the_contracted_process() -> None:
    manifests = render()
    deployment = one(manifests, 'Deployment', 'rel-shoal-operator')
    # kopf standalone: one operator at a time, also during upgrades.
    assert deployment['spec']['replicas'] == 1
    assert deployment['spec']['strategy'] == {'type': 'Recreate'}
    pod = deployment['spec']['template']['spec']
    operator = container(pod, 'operator')
    assert operator['command'] == ['shoal-operator']
    assert operator['image'] == 'ghcr.io/shoal-dev/shoal:0.1.0'
    assert {p['name']: p['containerPort'] for p in operator['ports']} == {
        'health': 8080,
        'metrics': 9090,
    }
    assert operator['livenessProbe']['httpGet'] == {'path': '/healthz', 'port': 'health'}
    assert env(operator) == {
        'SHOAL_OPERATOR_NAMESPACES': NAMESPACE,
        'SHOAL_OPERATOR_POD_NAMESPACE': {'fieldRef': {'fieldPath': 'metadata.namespace'}},
        'SHOAL_BROKER_IMAGE': 'ghcr.io/shoal-dev/shoal:0.1.0',
        'SHOAL_OPERATOR_LOG_LEVEL': 'INFO',
    }
    assert pod['securityContext']['runAsNonRoot'] is True
    assert operator['securityContext']['readOnlyRootFilesystem'] is True
    assert {'name': 'tmp', 'mountPath': '/tmp'} in operator['volumeMounts']
    assert pod['serviceAccountName'] == one(manifests, 'ServiceAccount')['metadata']['name']


def test_namespaced_rbac_grants_exactly_the_contract_in_each_watched_namespace() -> None:
    manifests = render({'rbac': {'watchNamespaces': ['team-a', 'team-b']}})
    assert env(operator_container(manifests))['SHOAL_OPERATOR_NAMESPACES'] == 'team-a,team-b'
    roles = find(manifests, 'Role')
    # The watched namespaces only: nothing of the operator's lives in its own namespace.
    assert sorted(r['metadata']['namespace'] for r in roles) == ['team-a', 'team-b']
    for role in roles:
        assert granted(role) == NAMESPACED_NEEDS
    bindings = find(manifests, 'RoleBinding')
    assert sorted(b['metadata']['namespace'] for b in bindings) == ['team-a', 'team-b']
    for binding in bindings:
        assert binding['subjects'] == [
            {'kind': 'ServiceAccount', 'name': 'rel-shoal-operator', 'namespace': NAMESPACE}
        ]
        assert binding['roleRef']['name'] == 'rel-shoal-operator'
    # Nothing at cluster scope.
    assert find(manifests, 'ClusterRole') == find(manifests, 'ClusterRoleBinding') == []


def test_namespaced_rbac_defaults_to_the_release_namespace() -> None:
    manifests = render()
    assert [r['metadata']['namespace'] for r in find(manifests, 'Role')] == [NAMESPACE]
    assert env(operator_container(manifests))['SHOAL_OPERATOR_NAMESPACES'] == NAMESPACE


def test_cluster_rbac_is_one_cluster_role_and_watches_everything() -> None:
    manifests = render({'rbac': {'scope': 'cluster'}})
    assert find(manifests, 'Role') == []
    assert find(manifests, 'RoleBinding') == []
    assert granted(one(manifests, 'ClusterRole')) == NAMESPACED_NEEDS
    binding = one(manifests, 'ClusterRoleBinding')
    assert binding['subjects'][0]['name'] == 'rel-shoal-operator'
    assert env(operator_container(manifests))['SHOAL_OPERATOR_NAMESPACES'] == ''


def test_rbac_off_creates_no_roles() -> None:
    manifests = render({'rbac': {'create': False}})
    kinds = {m['kind'] for m in manifests}
    assert kinds.isdisjoint({'Role', 'RoleBinding', 'ClusterRole', 'ClusterRoleBinding'})


def test_operator_metrics_service_and_service_monitor_meet() -> None:
    manifests = render({'serviceMonitor': {'enabled': True, 'labels': {'release': 'prom'}}})
    service = one(manifests, 'Service', 'rel-shoal-operator')
    monitor = one(manifests, 'ServiceMonitor')
    assert monitor['metadata']['labels']['release'] == 'prom'
    labels = service['metadata']['labels']
    assert monitor['spec']['selector']['matchLabels'].items() <= labels.items()
    assert [e['port'] for e in monitor['spec']['endpoints']] == ['metrics']
    assert [p['name'] for p in service['spec']['ports']] == ['metrics']
    pod_labels = one(manifests, 'Deployment')['spec']['template']['metadata']['labels']
    assert service['spec']['selector'].items() <= pod_labels.items()
    # The brokers' ServiceMonitor is the operator's, asked for through the BrokerCluster.
    cluster = one(manifests, 'BrokerCluster')
    assert cluster['spec']['metrics']['serviceMonitor']['enabled'] is True
    assert cluster['spec']['metrics']['serviceMonitor']['labels'] == {'release': 'prom'}
