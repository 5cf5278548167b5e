"""
What the operator applied last, so that correcting a child also removes what it no longer renders.

``k8s.Kube.apply`` corrects a child with a JSON merge patch, which adds and changes keys but never
removes one it does not mention: a label or annotation dropped from ``spec.podTemplate`` (or from
``spec.service.annotations``, a ``nodeSelector`` entry, an affinity term) would stay on the child,
and on every new pod, for good. Sending ``null`` for every key the live object has and the manifest
lacks is no fix: it would also strip what others put there (``kubectl rollout restart``'s
annotation, another controller's labels) and the fields the API server defaults.

So, as ``kubectl apply`` does with its ``last-applied-configuration``, every child carries the
annotation :data:`LAST_APPLIED_KEYS`: the key tree of the manifest last applied (the keys of every
nested object, no values, so no Secret data is copied into metadata). The next apply sends ``null``
for each key of that tree the new manifest no longer has, and nothing for keys it never applied.
Lists are leaves: a merge patch replaces a list whole. A child without the annotation (created
before it existed) loses nothing on the first apply, since nobody can tell which keys were ours;
that apply records the tree, and removals work from then on.
"""

import json
from collections.abc import Mapping
from typing import Any

from shoal_operator.manifests.config import Manifest

LAST_APPLIED_KEYS = 'shoal.dev/last-applied-keys'
"""Annotation on every child: JSON of the key tree the operator applied last (``null`` leaves)."""

KeyTree = dict[str, Any]
"""Key -> the key tree of its value when that value is an object, else ``None``."""


def key_tree(value: Mapping[str, Any]) -> KeyTree:
    return {k: key_tree(v) if isinstance(v, Mapping) else None for k, v in value.items()}


def recording(manifest: Mapping[str, Any]) -> Manifest:
    """``manifest`` with :data:`LAST_APPLIED_KEYS` naming its own keys (the annotation aside)."""
    meta = manifest['metadata']
    others = {k: v for k, v in (meta.get('annotations') or {}).items() if k != LAST_APPLIED_KEYS}
    tree = key_tree({**manifest, 'metadata': {**meta, 'annotations': others}})
    record = json.dumps(tree, sort_keys=True, separators=(',', ':'))
    return {**manifest, 'metadata': {**meta, 'annotations': {**others, LAST_APPLIED_KEYS: record}}}


def removing_dropped(current: Mapping[str, Any], manifest: Mapping[str, Any]) -> Manifest:
    """``manifest`` plus a ``null`` (merge-patch removal) for each key the last apply, as recorded
    on the live object ``current``, had and ``manifest`` no longer has."""
    return _with_removals(_recorded(current), manifest)


def _recorded(current: Mapping[str, Any]) -> KeyTree:
    """The key tree on ``current``; empty (remove nothing) when absent or not one we wrote."""
    text = ((current.get('metadata') or {}).get('annotations') or {}).get(LAST_APPLIED_KEYS)
    try:
        tree = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    return tree if isinstance(tree, dict) else {}


def _with_removals(recorded: KeyTree, desired: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(desired)
    for key, below in recorded.items():
        if key not in desired:
            merged[key] = None
        elif isinstance(below, dict) and isinstance(desired[key], Mapping):
            merged[key] = _with_removals(below, desired[key])
    return merged
