"""
What the apiextensions API server checks when a CustomResourceDefinition is created, for offline
tests (no API server runs in CI): a structural schema; every ``default`` pruned and valid against
the schema and the CEL rules of its node, as written (what the server checks) and with its own
nested defaults applied (what a stored object gets); CEL rules that read only declared fields,
guard optional ones with ``has()`` and stay within the cost budget; and nothing newer than the
oldest supported Kubernetes version.

Libraries do what they can: kubernetes-validate checks the CRD object against the
apiextensions.k8s.io/v1 OpenAPI of one Kubernetes version, jsonschema validates defaults and
objects (crdrules), cel-python parses and evaluates the rules. No Python library implements the
structural-schema rules, the CEL cost estimate or a ``has()`` analysis, so those are written here
by hand after the Kubernetes documentation ("Specifying a structural schema", "Validation rules",
"Resource use by validation functions"). The cost check is stricter than the server's estimate:
every string, list or map a rule reads must be bounded (maxLength or enum, maxItems,
maxProperties), and no rule may sit below an unbounded list or map.
"""

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import yaml
from crdrules import Schema, cel_errors, defaulted, outcomes, schema_errors
from lark import Token, Tree

ROOT = Path(__file__).resolve().parents[2]

# Keys the apiextensions.k8s.io/v1 API refuses in a schema, and keys logical junctors may not set.
FORBIDDEN = ('$ref', '$schema', 'id', 'definitions', 'patternProperties', 'dependencies',
             'additionalItems')  # fmt: skip
JUNCTORS = ('allOf', 'anyOf', 'oneOf', 'not')
NOT_IN_JUNCTORS = ('description', 'type', 'default', 'additionalProperties', 'nullable')
SCALARS = ('string', 'integer', 'number', 'boolean')

# CEL functions and macros of the CEL standard definitions, which every Kubernetes version with
# CRD validation rules has. The Kubernetes libraries (lists, regex, URLs, quantity, IP, CIDR,
# format, sets, ...) and cel-go's string extensions arrived in different versions: look a
# function up in the Kubernetes "CEL libraries" table, and keep it out while the oldest
# supported version lacks it, before adding it here.
STANDARD_FUNCTIONS = frozenset({
    'has', 'size', 'matches', 'startsWith', 'endsWith', 'contains', 'all', 'exists',
    'exists_one', 'map', 'filter', 'int', 'uint', 'double', 'string', 'bytes', 'bool', 'type',
    'dyn', 'duration', 'timestamp',
})  # fmt: skip


def load_crds() -> dict[str, dict[str, Any]]:
    """Kind → CRD object, from crds/."""
    crds = (yaml.safe_load(p.read_text()) for p in sorted((ROOT / 'crds').glob('*.yaml')))
    return {crd['spec']['names']['kind']: crd for crd in crds}


def oldest_kubernetes() -> str:
    """The oldest Kubernetes version the chart supports, from Chart.yaml's kubeVersion
    ('>=1.28.0-0' → '1.28.0')."""
    chart = yaml.safe_load((ROOT / 'charts/shoal/Chart.yaml').read_text())
    constraint = str(chart['kubeVersion'])
    assert constraint.startswith('>='), constraint
    return constraint[2:].split('-')[0]


def openapi_schemas(crd: dict[str, Any]) -> Iterator[tuple[str, Schema]]:
    for version in crd['spec']['versions']:
        yield f'{version["name"]}.openAPIV3Schema', version['schema']['openAPIV3Schema']


Located = tuple[str, Schema, list[Schema]]


def nodes(schema: Schema, path: str) -> Iterator[Located]:
    """(path, node, ancestors) for the node and every property, item and map value below it."""

    def walk(node: Schema, here: str, above: list[Schema]) -> Iterator[Located]:
        yield here, node, above
        for name, sub in (node.get('properties') or {}).items():
            yield from walk(sub, f'{here}.properties[{name}]', [*above, node])
        if isinstance(node.get('items'), dict):
            yield from walk(node['items'], f'{here}.items', [*above, node])
        if isinstance(node.get('additionalProperties'), dict):
            yield from walk(
                node['additionalProperties'], f'{here}.additionalProperties', [*above, node]
            )

    return walk(schema, path, [])


# --- structural schema ---------------------------------------------------------------------


def structural_errors(schema: Schema, path: str = 'openAPIV3Schema') -> list[str]:
    """Why SCHEMA is not structural, or otherwise refused by apiextensions.k8s.io/v1."""
    errors = []
    if schema.get('type') != 'object':
        errors.append(f'{path}.type: must be object')
    metadata = (schema.get('properties') or {}).get('metadata')
    if metadata is not None:
        restricted = set(metadata.get('properties') or {}) - {'name', 'generateName'}
        other = set(metadata) - {'type', 'description', 'properties'}
        if restricted or other:
            errors.append(
                f'{path}.properties[metadata]: only metadata.name and metadata.generateName '
                f'may be restricted, not {sorted(restricted | other)}'
            )
    for here, node, _ in nodes(schema, path):
        errors += _node_errors(here, node)
    return errors


def _node_errors(here: str, node: Schema) -> list[str]:
    errors = [f'{here}.{key}: must not be set' for key in FORBIDDEN if key in node]
    free = node.get('x-kubernetes-int-or-string') or node.get(
        'x-kubernetes-preserve-unknown-fields'
    )
    if not node.get('type') and not free:
        errors.append(f'{here}.type: must not be empty for specified object fields')
    if node.get('x-kubernetes-preserve-unknown-fields') is False:
        errors.append(f'{here}.x-kubernetes-preserve-unknown-fields: must be true or undefined')
    if 'properties' in node and 'additionalProperties' in node:
        errors.append(f'{here}: additionalProperties and properties are mutually exclusive')
    if node.get('additionalProperties') is False:
        errors.append(f'{here}.additionalProperties: must not be false')
    if node.get('uniqueItems'):
        errors.append(f'{here}.uniqueItems: cannot be set to true')
    if node.get('type') == 'array' and not isinstance(node.get('items'), dict):
        errors.append(f'{here}.items: must be one schema for an array')
    for junctor in JUNCTORS:
        for sub in _as_list(node.get(junctor)):
            errors += _junctor_errors(f'{here}.{junctor}', sub, node)
    return errors + _list_errors(here, node)


def _list_errors(here: str, node: Schema) -> list[str]:
    """Map lists (server-side apply merges their items by key) need scalar keys every item has."""
    errors = []
    list_type = node.get('x-kubernetes-list-type')
    keys = node.get('x-kubernetes-list-map-keys')
    if keys is not None and list_type != 'map':
        errors.append(f'{here}.x-kubernetes-list-map-keys: needs x-kubernetes-list-type map')
    if list_type == 'map':
        items = node.get('items') or {}
        props = items.get('properties') or {}
        if items.get('type') != 'object' or not keys:
            errors.append(f'{here}: a map list needs object items and x-kubernetes-list-map-keys')
        for key in keys or []:
            sub = props.get(key)
            if sub is None or sub.get('type') not in SCALARS:
                errors.append(
                    f'{here}.x-kubernetes-list-map-keys: {key} must be a scalar '
                    'property of the items'
                )
            elif key not in (items.get('required') or []) and 'default' not in sub:
                errors.append(
                    f'{here}.x-kubernetes-list-map-keys: {key} must be required or have a default'
                )
    return errors


def _as_list(value: Any) -> list[Schema]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _junctor_errors(here: str, sub: Schema, outside: Schema) -> list[str]:
    """Junctors carry value validations only, on fields also specified outside them."""
    errors = [
        f'{here}.{key}: must not be set inside a logical junctor'
        for key in NOT_IN_JUNCTORS
        if key in sub
    ]
    for name, prop in (sub.get('properties') or {}).items():
        if name not in (outside.get('properties') or {}):
            errors.append(f'{here}.properties[{name}]: must be specified outside the junctor too')
        else:
            errors += _junctor_errors(
                f'{here}.properties[{name}]', prop, outside['properties'][name]
            )
    if isinstance(sub.get('items'), dict):
        if not isinstance(outside.get('items'), dict):
            errors.append(f'{here}.items: must be specified outside the junctor too')
        else:
            errors += _junctor_errors(f'{here}.items', sub['items'], outside['items'])
    for junctor in JUNCTORS:
        for inner in _as_list(sub.get(junctor)):
            errors += _junctor_errors(f'{here}.{junctor}', inner, outside)
    return errors


# --- defaults --------------------------------------------------------------------------------


def default_errors(schema: Schema, path: str = 'openAPIV3Schema') -> list[str]:
    """Every default that is refused: validated, as the API server does when the CRD is created,
    against its node's schema (unknown fields included) and the CEL rules of its node and the
    nodes below (with oldSelf = the default); then again with its own nested defaults applied,
    which is what a stored object gets."""
    errors = []
    for here, node, _ in nodes(schema, path):
        if 'default' not in node:
            continue
        written = node['default']
        nested = defaulted(node, copy.deepcopy(written))
        for label, value in (('', written), (' (nested defaults applied)', nested)):
            problems = schema_errors(node, value) + cel_errors(node, value, value)
            errors += [f'{here}.default{label}: {problem}' for problem in problems]
    return errors


# --- CEL rules: fields read, cost, functions -------------------------------------------------


@dataclass(frozen=True)
class Read:
    """A field path a rule reads from ``self`` or ``oldSelf``; ``tested`` when it is only the
    argument of has()."""

    root: str
    path: tuple[str, ...]
    tested: bool


def reads(rule: str) -> tuple[list[Read], set[str]]:
    """The field paths RULE reads and the functions and macros it calls, from cel-python's parse
    tree (only the longest path of each selection: ``self.a.b`` reads b, passing through a)."""
    found: list[Read] = []
    functions: set[str] = set()
    _walk(celpy.Environment().compile(rule), False, found, functions)
    return found, functions


def _walk(tree: Tree[Token], tested: bool, found: list[Read], functions: set[str]) -> None:
    if tree.data == 'member_dot':
        path = _selection(tree)
        if path is not None and path[0] in ('self', 'oldSelf'):
            found.append(Read(path[0], path[1:], tested))
            return
    if tree.data == 'ident' and str(tree.children[0]) in ('self', 'oldSelf'):
        found.append(Read(str(tree.children[0]), (), tested))
    if tree.data == 'ident_arg':
        functions.add(str(tree.children[0]))
        tested = str(tree.children[0]) == 'has'
    if tree.data == 'member_dot_arg':
        functions.add(str(tree.children[1]))
    for child in tree.children:
        if isinstance(child, Tree):
            _walk(child, tested, found, functions)


def _selection(tree: Tree[Token]) -> tuple[str, ...] | None:
    """('self', 'a', 'b') for the parse tree of ``self.a.b``; None when not rooted at a name."""
    names: list[str] = []
    while tree.data == 'member_dot':
        member, name = tree.children
        names.insert(0, str(name))
        assert isinstance(member, Tree)
        (tree,) = member.children  # type: ignore[assignment]
    if tree.data == 'primary':
        (ident,) = tree.children
        if isinstance(ident, Tree) and ident.data == 'ident':
            return (str(ident.children[0]), *names)
    return None


def rule_errors(schema: Schema, path: str = 'openAPIV3Schema') -> list[str]:
    """Rules that read undeclared fields (the server's type check refuses them), read strings,
    lists or maps of unbounded size or sit below an unbounded list or map (the server's cost
    estimate refuses them), use oldSelf below a list whose items cannot be matched with the old
    ones (only map lists can), carry a message on several lines, or call functions outside
    STANDARD_FUNCTIONS."""
    errors = []
    for here, node, above in nodes(schema, path):
        for rule in node.get('x-kubernetes-validations') or []:
            where = f'{here}: rule {rule["rule"]!r}'
            for parent in above:
                if unbounded(parent, shallow=True):
                    errors.append(f'{where}: sits below {unbounded(parent, shallow=True)[0]}')
                if (
                    'oldSelf' in rule['rule']
                    and parent.get('type') == 'array'
                    and parent.get('x-kubernetes-list-type') != 'map'
                ):
                    errors.append(f'{where}: oldSelf below a list that is not a map list')
            if '\n' in rule.get('message', '') or (
                '\n' in rule['rule'] and not rule.get('message')
            ):
                errors.append(
                    f'{where}: the message must be one line, and set for a multi-line rule'
                )
            found, functions = reads(rule['rule'])
            for function in sorted(functions - STANDARD_FUNCTIONS):
                errors.append(f'{where}: calls {function}, not in STANDARD_FUNCTIONS')
            for read in found:
                target = resolve(node, read.path)
                if isinstance(target, str):
                    errors.append(f'{where}: {read.root}.{".".join(read.path)}: {target}')
                elif target is not None and not read.tested:
                    prefix = '.'.join(('', *read.path))
                    errors += [
                        f'{where}: reads {read.root}{dotted} of unbounded size'
                        for dotted in unbounded(target, prefix=prefix)
                    ]
    return errors


def resolve(node: Schema, path: tuple[str, ...]) -> Schema | str | None:
    """The schema at PATH below NODE; None below fields whose content is not declared; an error
    text for a field that does not exist."""
    for name in path:
        properties = node.get('properties') or {}
        extra = node.get('additionalProperties')
        if name in properties:
            node = properties[name]
        elif isinstance(extra, dict):
            node = extra
        elif node.get('x-kubernetes-preserve-unknown-fields'):
            return None
        else:
            return f'undefined field {name!r}'
    return node


def unbounded(node: Schema, prefix: str = '', shallow: bool = False) -> list[str]:
    """Paths below NODE (NODE itself only, when SHALLOW) whose size has no declared bound."""
    found = []
    kind = node.get('type')
    if node.get('x-kubernetes-preserve-unknown-fields') and not node.get('properties'):
        found.append(f'{prefix or "self"} (undeclared fields)')
    elif kind == 'string' and 'maxLength' not in node and 'enum' not in node:
        found.append(prefix or 'self')
    elif kind == 'array' and 'maxItems' not in node:
        found.append(f'{prefix}[] (no maxItems)')
    elif isinstance(node.get('additionalProperties'), dict) and 'maxProperties' not in node:
        found.append(f'{prefix}{{}} (no maxProperties)')
    if shallow:
        return found
    for name, sub in (node.get('properties') or {}).items():
        found += unbounded(sub, f'{prefix}.{name}')
    if isinstance(node.get('items'), dict):
        found += unbounded(node['items'], f'{prefix}[*]')
    if isinstance(node.get('additionalProperties'), dict):
        found += unbounded(node['additionalProperties'], f'{prefix}[*]')
    return found


# --- has() guards, by evaluation -------------------------------------------------------------


def sample(schema: Schema, every_field: bool) -> Any:
    """A value of SCHEMA's shape with its required fields (with EVERY_FIELD, all of them, and
    one item in every list)."""
    kind = schema.get('type')
    if kind == 'object':
        required = set(schema.get('required') or [])
        return {
            name: sample(sub, every_field)
            for name, sub in (schema.get('properties') or {}).items()
            if every_field or name in required
        }
    if kind == 'array':
        return [sample(schema['items'], every_field)] if every_field else []
    if 'enum' in schema:
        return schema['enum'][0]
    if kind == 'string':
        return 'x' * max(1, schema.get('minLength', 1))
    if kind == 'integer':
        return max(1, schema.get('minimum', 1))
    if kind == 'number':
        return 1.0
    if kind == 'boolean':
        return False
    return {}


def optional_paths(
    schema: Schema, value: Any, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every field of VALUE (an object of SCHEMA's shape) that SCHEMA does not require."""
    if not isinstance(value, dict):
        return
    required = set(schema.get('required') or [])
    for name, sub in (schema.get('properties') or {}).items():
        if name in value:
            if name not in required:
                yield (*path, name)
            yield from optional_paths(sub, value[name], (*path, name))


def without(value: Any, path: tuple[str, ...]) -> Any:
    value = copy.deepcopy(value)
    parent = value
    for name in path[:-1]:
        parent = parent[name]
    del parent[path[-1]]
    return value


def unguarded_reads(schema: Schema) -> list[str]:
    """Rules that cannot be evaluated on an object the schema accepts: each rule is evaluated, as
    the API server would after defaulting, on the minimal object (required fields only), on the
    object with every field, and on the latter without each optional field in turn (creates, and
    updates from and to the full object). A failure to evaluate means a field is read without
    has(); a rule that merely returns false is fine here."""
    full = defaulted(schema, sample(schema, every_field=True))
    cases = [('minimal object', sample(schema, every_field=False)), ('full object', full)]
    cases += [(f'without {".".join(p)}', without(full, p)) for p in optional_paths(schema, full)]
    errors = set()
    for label, case in cases:
        obj = defaulted(schema, copy.deepcopy(case))
        for new, old in ((obj, None), (obj, obj), (obj, full), (full, obj)):
            for outcome in outcomes(schema, new, old):
                if outcome.passed is None:
                    errors.add(f'{label}: {outcome.path or "self"}: {outcome.text()}')
    return sorted(errors)


# --- the oldest supported Kubernetes ---------------------------------------------------------


def api_errors(crd: dict[str, Any], version: str) -> list[str]:
    """What the apiextensions.k8s.io/v1 OpenAPI of Kubernetes VERSION refuses in CRD (unknown
    fields included: a key that version does not have), with kubernetes-validate."""
    try:
        kubernetes_validate.validate(crd, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f'{list(error.path)}: {error.message}']
    return []
