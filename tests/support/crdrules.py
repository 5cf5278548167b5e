"""
What the API server does with a custom resource before storing it, for tests: apply the CRD's
schema defaults, then evaluate its CEL rules (x-kubernetes-validations) with cel-python.
"""

import copy
from typing import Any

import celpy


def defaulted(schema: dict[str, Any], value: Any) -> Any:
    """Apply schema defaults, as the API server does before validation."""
    if isinstance(value, dict) and schema.get('type') == 'object':
        for name, sub in (schema.get('properties') or {}).items():
            if name not in value and 'default' in sub:
                value[name] = copy.deepcopy(sub['default'])
            if name in value:
                value[name] = defaulted(sub, value[name])
    return value


def cel_errors(schema: dict[str, Any], new: Any, old: Any | None) -> list[str]:
    """Messages of the x-kubernetes-validations rules ``new`` breaks (transition rules only with
    an ``old``), walking the schema like the API server."""
    errors = []
    for rule in schema.get('x-kubernetes-validations') or []:
        if 'oldSelf' in rule['rule'] and old is None:
            continue
        env = celpy.Environment()
        program = env.program(env.compile(rule['rule']))
        activation = {'self': celpy.json_to_cel(new)}
        if old is not None:
            activation['oldSelf'] = celpy.json_to_cel(old)
        if not bool(program.evaluate(activation)):
            errors.append(rule['message'])
    if isinstance(new, dict):
        for name, sub in (schema.get('properties') or {}).items():
            if name in new:
                child_old = old.get(name) if isinstance(old, dict) else None
                if old is not None and child_old is None:
                    continue  # a field-level transition rule needs the field on both sides
                errors += cel_errors(sub, new[name], child_old)
    return errors
