"""
The CRDs as the apiextensions API server takes them (`kubectl apply --server-side -f crds/`),
offline: structural schemas, defaults valid as written and with their nested defaults (schema and
CEL), CEL rules that read declared, bounded fields with has() guards and standard functions, and
only API fields of the oldest supported Kubernetes version. Each checker is also shown catching
the class of mistake it is here for.
"""

from typing import Any

import pytest
from crdcheck import (
    api_errors,
    default_errors,
    load_crds,
    oldest_kubernetes,
    openapi_schemas,
    rule_errors,
    structural_errors,
    unguarded_reads,
)

CRDS = load_crds()
KINDS = sorted(CRDS)


@pytest.mark.parametrize('kind', KINDS)
def test_every_schema_is_structural(kind: str) -> None:
    assert [e for path, s in openapi_schemas(CRDS[kind]) for e in structural_errors(s, path)] == []


@pytest.mark.parametrize('kind', KINDS)
def test_every_default_is_valid_as_written_and_with_its_nested_defaults(kind: str) -> None:
    assert [e for path, s in openapi_schemas(CRDS[kind]) for e in default_errors(s, path)] == []


@pytest.mark.parametrize('kind', KINDS)
def test_every_rule_reads_declared_bounded_fields_with_standard_functions(kind: str) -> None:
    assert [e for path, s in openapi_schemas(CRDS[kind]) for e in rule_errors(s, path)] == []


@pytest.mark.parametrize('kind', KINDS)
def test_every_rule_evaluates_on_every_object_missing_optional_fields(kind: str) -> None:
    assert [e for _, s in openapi_schemas(CRDS[kind]) for e in unguarded_reads(s)] == []


@pytest.mark.parametrize('kind', KINDS)
def test_the_crds_use_only_api_fields_of_the_oldest_supported_kubernetes(kind: str) -> None:
    assert api_errors(CRDS[kind], oldest_kubernetes()) == []


def obj(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {'type': 'object', 'properties': properties, **extra}


STRING = {'type': 'string', 'maxLength': 10}


def test_the_structural_check_catches_what_it_is_here_for() -> None:
    schema = obj({
        'spec': obj({
            'untyped': {'description': 'no type'},
            'closed': obj({'a': STRING}, additionalProperties=False),
            'junctor': obj({'a': STRING}, anyOf=[{'type': 'object', 'properties': {'b': STRING}}]),
            'keys': {'type': 'array', 'x-kubernetes-list-type': 'map',
                     'x-kubernetes-list-map-keys': ['name'], 'items': obj({'name': STRING})},
        }),
        'metadata': obj({'labels': obj({})}),
    })  # fmt: skip
    errors = '\n'.join(structural_errors(schema))
    for expected in ('properties[untyped].type: must not be empty',
                     'properties[closed].additionalProperties: must not be false',
                     'anyOf.type: must not be set inside a logical junctor',
                     'anyOf.properties[b]: must be specified outside the junctor too',
                     'name must be required or have a default',
                     'only metadata.name and metadata.generateName'):  # fmt: skip
        assert expected in errors


def test_the_default_check_catches_a_default_breaking_its_own_rule() -> None:
    """The BrokerCluster CRD a real API server refused: spec.auth's default {} failed the rule on
    spec.auth, as written (no such key) and with its nested default (allowAnonymous false)."""
    auth = obj({'allowAnonymous': {'type': 'boolean', 'default': False}, 'usersSecretName': STRING},
               default={}, **{'x-kubernetes-validations': [
                   {'rule': 'self.allowAnonymous || has(self.usersSecretName)',
                    'message': 'usersSecretName is required'}]})  # fmt: skip
    errors = default_errors(obj({'spec': obj({'auth': auth})}))
    assert len(errors) == 2, errors
    assert "no such member in mapping: 'allowAnonymous'" in errors[0]
    assert errors[1].endswith('(nested defaults applied): usersSecretName is required')
    out_of_range = obj({'n': {'type': 'integer', 'minimum': 1, 'default': 0}})
    assert default_errors(out_of_range) == [
        'openAPIV3Schema.properties[n].default: []: 0 is less than the minimum of 1',
        'openAPIV3Schema.properties[n].default (nested defaults applied): []: 0 is less than the '
        'minimum of 1',
    ]
    unknown = obj({'o': obj({'a': STRING}, default={'b': 'x'})})
    assert 'Additional properties are not allowed' in default_errors(unknown)[0]


def test_the_rule_check_catches_unbounded_undeclared_and_newer_reads() -> None:
    def rules_of(node: dict[str, Any], *rules: str) -> dict[str, Any]:
        return {**node, 'x-kubernetes-validations': [{'rule': r} for r in rules]}

    schema = obj({'spec': rules_of(obj({
        'name': {'type': 'string'},
        'bounded': STRING,
        'tags': {'type': 'array', 'items': rules_of(STRING, "self != 'x'", 'self == oldSelf')},
    }), "self.name == 'a'", "has(self.name) && self.bounded == 'b'", "self.missing == 1",
        "self.bounded.lowerAscii() == 'b'")})  # fmt: skip
    errors = '\n'.join(rule_errors(schema))
    assert 'reads self.name of unbounded size' in errors
    assert "self.missing: undefined field 'missing'" in errors
    assert 'calls lowerAscii, not in STANDARD_FUNCTIONS' in errors
    assert 'rule "self != \'x\'": sits below [] (no maxItems)' in errors
    assert "rule 'self == oldSelf': oldSelf below a list that is not a map list" in errors
    assert 'has(self.name)' not in errors  # has() reads no size, and bounded is bounded
    two_lines = [{'rule': "self.a == 'x'", 'message': 'one\ntwo'}]
    assert 'message must be one line' in rule_errors(obj({'a': STRING}, **{
        'x-kubernetes-validations': two_lines}))[0]  # fmt: skip


def test_the_has_check_catches_an_optional_field_read_without_has() -> None:
    rule = {'rule': "self.mode == 'a'"}
    fields = {'mode': STRING, 'fixed': {**STRING, 'default': 'f'}}
    schema = obj({'spec': obj(fields, **{'x-kubernetes-validations': [rule]})})
    errors = unguarded_reads(schema)
    assert any("without spec.mode: .spec: no such member in mapping: 'mode'" in e for e in errors)
    rule['rule'] = "(has(self.mode) && self.mode == 'a') || self.fixed == 'f'"
    assert unguarded_reads(schema) == []  # a defaulted field is always there after defaulting


def test_the_version_check_refuses_a_rule_key_newer_than_the_oldest_version() -> None:
    crd = CRDS['Queue']
    rule = {'rule': 'self == oldSelf', 'optionalOldSelf': True}  # Kubernetes 1.29
    spec = crd['spec']['versions'][0]['schema']['openAPIV3Schema']['properties']['spec']
    newer = {**crd, 'spec': {**crd['spec'], 'versions': [{
        **crd['spec']['versions'][0],
        'schema': {'openAPIV3Schema': obj({'spec': {**spec, 'x-kubernetes-validations': [rule]}})},
    }]}}  # fmt: skip
    assert "'optionalOldSelf' was unexpected" in api_errors(newer, '1.28.0')[0]
    assert api_errors(newer, '1.29.0') == []
