"""
What the API server does with a custom resource before storing it, for tests: apply the CRD's
schema defaults (the apiextensions defaulting algorithm), validate the result against the
OpenAPI schema (jsonschema) and evaluate its CEL rules (x-kubernetes-validations, cel-python).

jsonschema validates and cel-python evaluates CEL, but no Python library knows CRDs, so the
apiextensions defaulting algorithm and the walk that binds ``self`` and ``oldSelf`` to each node,
as the API server's CEL validator does, are written here by hand. A rule that cannot be evaluated
(a field it reads is absent) is an error, as on the server, which answers
``no such key: ... evaluating rule: ...``.
"""

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import celpy
import jsonschema

Schema = dict[str, Any]


def defaulted(schema: Schema, value: Any) -> Any:
    """Apply schema defaults in place, as the API server does before validation: a missing
    property gets a copy of its default, then every property, map value and list item is
    defaulted in turn (so the fields of a defaulted object get their own defaults too)."""
    if isinstance(value, dict):
        properties = schema.get('properties') or {}
        for name, sub in properties.items():
            if name not in value and 'default' in sub:
                value[name] = copy.deepcopy(sub['default'])
        extra = schema.get('additionalProperties')
        for name in value:
            if name in properties:
                value[name] = defaulted(properties[name], value[name])
            elif isinstance(extra, dict):
                value[name] = defaulted(extra, value[name])
    elif isinstance(value, list) and isinstance(schema.get('items'), dict):
        value[:] = [defaulted(schema['items'], item) for item in value]
    return value


@cache
def _program(rule: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(rule))


@dataclass(frozen=True)
class Outcome:
    """One rule evaluated at one node: ``passed`` is None when evaluation itself failed."""

    path: str
    rule: str
    message: str
    passed: bool | None
    error: str = ''

    def text(self) -> str:
        if self.passed is None:
            return f'{self.error} evaluating rule: {self.rule}'
        return self.message


def outcomes(schema: Schema, new: Any, old: Any | None, path: str = '') -> Iterator[Outcome]:
    """Every x-kubernetes-validations rule evaluated over NEW (transition rules, those naming
    ``oldSelf``, only where OLD has the node), walking the schema like the API server."""
    for rule in schema.get('x-kubernetes-validations') or []:
        if 'oldSelf' in rule['rule'] and old is None:
            continue
        activation = {'self': celpy.json_to_cel(new)}
        if old is not None:
            activation['oldSelf'] = celpy.json_to_cel(old)
        message = rule.get('message', f'failed rule: {rule["rule"]}')
        try:
            result = _program(rule['rule']).evaluate(activation)
        except celpy.CELEvalError as error:
            yield Outcome(path, rule['rule'], message, None, str(error.args[0]))
            continue
        if isinstance(result, celpy.CELEvalError):
            yield Outcome(path, rule['rule'], message, None, str(result.args[0]))
        else:
            yield Outcome(path, rule['rule'], message, bool(result))
    if isinstance(new, dict):
        properties = schema.get('properties') or {}
        extra = schema.get('additionalProperties')
        for name, value in new.items():
            sub = properties.get(name, extra if isinstance(extra, dict) else None)
            if sub is not None:
                child_old = old.get(name) if isinstance(old, dict) else None
                yield from outcomes(sub, value, child_old, f'{path}.{name}')
    elif isinstance(new, list) and isinstance(schema.get('items'), dict):
        for index, item in enumerate(new):  # list items are not correlated with old ones here
            yield from outcomes(schema['items'], item, None, f'{path}[{index}]')


def cel_errors(schema: Schema, new: Any, old: Any | None) -> list[str]:
    """Messages of the rules NEW breaks or cannot be evaluated on (transition rules only with
    an OLD)."""
    return [o.text() for o in outcomes(schema, new, old) if not o.passed]


_VALUES = {'default', 'enum', 'example'}  # keys whose values are data, not schemas


def strict(schema: Any) -> Any:
    """SCHEMA with unknown fields as a validation error: kubectl (field validation Strict, the
    default since Kubernetes 1.27) refuses them where the API server would prune them."""
    if isinstance(schema, dict):
        schema = {k: v if k in _VALUES else strict(v) for k, v in schema.items()}
        if (
            schema.get('type') == 'object'
            and 'properties' in schema
            and 'additionalProperties' not in schema
            and not schema.get('x-kubernetes-preserve-unknown-fields')
        ):
            schema['additionalProperties'] = False
    elif isinstance(schema, list):
        schema = [strict(v) for v in schema]
    return schema


def schema_errors(schema: Schema, value: Any) -> list[str]:
    """OpenAPI (jsonschema) violations of VALUE, unknown fields included."""
    validator = jsonschema.Draft7Validator(strict(schema))
    return [f'{list(e.absolute_path)}: {e.message}' for e in validator.iter_errors(value)]


def resource_schema(crd: dict[str, Any]) -> Schema:
    """The storage version's openAPIV3Schema, with metadata left to the API server (as its
    structural schema does: only name and generateName may be restricted there)."""
    (version,) = [v for v in crd['spec']['versions'] if v.get('storage')]
    schema = copy.deepcopy(version['schema']['openAPIV3Schema'])
    schema['properties']['metadata'] = {'type': 'object'}
    return dict(schema)


def admission_errors(crd: dict[str, Any], doc: dict[str, Any], old: Any | None = None) -> list[str]:
    """Every reason the API server refuses DOC (a create, or an update of OLD): defaults
    applied, then the schema and the CEL rules."""
    schema = resource_schema(crd)
    new = defaulted(schema, copy.deepcopy(doc))
    previous = defaulted(schema, copy.deepcopy(old)) if old is not None else None
    return schema_errors(schema, new) + cel_errors(schema, new, previous)
