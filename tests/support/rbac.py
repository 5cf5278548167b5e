"""
Kubernetes RBAC decisions, offline: the access (verb, API group, resource, namespace) an HTTP
request to the API server asks for, and whether rendered Role/ClusterRole rules allow it, the way
the API server's RBAC authorizer decides (a rule allows when its group, resource and verb all
match; a Role only in its namespace). Used to hold the operator to the chart's RBAC, both ways.
"""

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import chartrender

Manifest = Mapping[str, Any]
TOKEN = 'shoal-operator'
"""The bearer token the tests' operator logs in with: its requests are told from the test's."""


@dataclasses.dataclass(frozen=True, order=True)
class Access:
    verb: str
    group: str
    resource: str
    """With the subresource, as RBAC names it: ``brokerclusters/status``."""
    namespace: str | None
    """None for a cluster-scoped request (also a list or watch across all namespaces)."""

    @property
    def grant(self) -> tuple[str, str, str]:
        return (self.group, self.resource, self.verb)


def access(method: str, path: str, params: Mapping[str, str]) -> Access | None:
    """The access a request needs; None for discovery (``/api``, ``/apis/<group>/<version>``,
    ``/version``), which every authenticated client may read."""
    parts = [p for p in path.split('/') if p]
    if parts[:1] == ['api'] and len(parts) >= 2:
        group, rest = '', parts[2:]
    elif parts[:1] == ['apis'] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace = None
    if rest[0] == 'namespaces' and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else '', rest[2:3]
    if method == 'GET':
        verb = 'watch' if params.get('watch') in ('true', '1') else 'get' if name else 'list'
    else:
        verb = {'POST': 'create', 'PUT': 'update', 'PATCH': 'patch'}.get(method, '')
        if method == 'DELETE':
            verb = 'delete' if name else 'deletecollection'
    return Access(verb, group, '/'.join([resource, *sub]), namespace)


def implied(method: str, path: str, body: Any) -> list[Access]:
    """What the API server's OwnerReferencesPermissionEnforcement admission also checks: an
    object written with ``blockOwnerDeletion`` needs ``update`` on its owner's finalizers."""
    found = access(method, path, {})
    if found is None or method not in ('POST', 'PUT', 'PATCH') or not isinstance(body, Mapping):
        return []
    needs = []
    for owner in (body.get('metadata') or {}).get('ownerReferences') or []:
        if owner.get('blockOwnerDeletion'):
            group = str(owner['apiVersion']).rpartition('/')[0]
            plural = f'{str(owner["kind"]).lower()}s'
            needs.append(Access('update', group, f'{plural}/finalizers', found.namespace))
    return needs


def _matches(rule: Mapping[str, Any], wanted: Access) -> bool:
    def has(values: Iterable[str], value: str) -> bool:
        return value in values or '*' in values

    return (
        has(rule.get('apiGroups') or [], wanted.group)
        and has(rule.get('resources') or [], wanted.resource)
        and has(rule.get('verbs') or [], wanted.verb)
        and not rule.get('resourceNames')
    )


def allowed(manifests: Iterable[Manifest], wanted: Access) -> bool:
    """Whether the rendered roles allow ``wanted`` (bindings are the chart's: every rendered
    role is bound to the operator's ServiceAccount; tests/chart checks that)."""
    for role in manifests:
        namespaced = role['kind'] == 'Role'
        if role['kind'] not in ('Role', 'ClusterRole'):
            continue
        if namespaced and role['metadata'].get('namespace') != wanted.namespace:
            continue
        if any(_matches(rule, wanted) for rule in role.get('rules') or []):
            return True
    return False


def granted(manifests: Iterable[Manifest]) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) a rendered role grants."""
    grants = set()
    for role in manifests:
        if role['kind'] in ('Role', 'ClusterRole'):
            for rule in role.get('rules') or []:
                for group in rule['apiGroups']:
                    for resource in rule['resources']:
                        grants.update((group, resource, verb) for verb in rule['verbs'])
    return grants


def operator_accesses(emulator: Any) -> list[tuple[Access, str]]:
    """Every access the operator's requests so far needed, with the request it came from."""
    found = []
    for request in list(emulator):
        if request.headers.get('Authorization') != f'Bearer {TOKEN}':
            continue
        path, method = request.url.path, str(request.method.value).upper()
        needed = access(method, path, dict(request.params))
        for each in [needed] if needed else []:
            found.append((each, f'{method} {path}'))
        found.extend((each, f'{method} {path}') for each in implied(method, path, request.data))
    return found


def operator_roles(values: dict[str, Any]) -> list[Manifest]:
    """The operator's Roles and ClusterRoles the chart renders with ``values``."""
    return [
        m
        for m in chartrender.render(values)
        if m['kind'] in ('Role', 'ClusterRole')
        and m['metadata']['labels'].get('app.kubernetes.io/component') == 'operator'
    ]
