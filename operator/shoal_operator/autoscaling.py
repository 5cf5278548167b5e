"""
``spec.autoscaling`` of a BrokerCluster, parsed: who sets ``spec.replicas`` besides the user.

Either the analytics job's recommendation (``fromAnalytics``, applied by the operator) or a
HorizontalPodAutoscaler (``enabled``, rendered by ``manifests.autoscaler``) that writes
``spec.replicas`` through the cluster's scale subresource; never both, since two writers of one
field undo each other. The CRD refuses the same (CEL); this module repeats its rules for an API
server that does not check them (kmock, or a resource stored before the rules), raising
``ValueError`` with the CRD's message.
"""

import dataclasses
import decimal
import re
from collections.abc import Mapping
from typing import Any

MIN_OVER_MAX = 'autoscaling.minReplicas must not exceed autoscaling.maxReplicas'
BOTH_WRITERS = (
    'autoscaling.enabled (a HorizontalPodAutoscaler) and autoscaling.fromAnalytics both set '
    'spec.replicas: choose one'
)
ONE_TARGET = 'an external metric needs exactly one of averageValue and value'

_QUANTITY = re.compile(r'([0-9]+(?:\.[0-9]+)?)([numkMGTPE]?)')
_EXPONENTS = {'n': -9, 'u': -6, 'm': -3, '': 0, 'k': 3, 'M': 6, 'G': 9, 'T': 12, 'P': 15, 'E': 18}
_SUFFIXES = {exponent: suffix for suffix, exponent in _EXPONENTS.items()}


def canonical_quantity(text: str) -> str:
    """A decimal-SI quantity as the API server writes it back: the integer mantissa with the
    largest suffix that keeps it whole (``1000`` -> ``1k``, ``1500`` -> ``1500``, ``0.5`` ->
    ``500m``), rounded up to nano units as the server does."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise ValueError(f'{text!r} is not a decimal quantity (digits, then n u m k M G T P E)')
    number, suffix = match.groups()
    value = decimal.Decimal(number).scaleb(_EXPONENTS[suffix] + 9)
    nanos = int(value.to_integral_value(rounding=decimal.ROUND_CEILING))
    if nanos == 0:
        return '0'
    exponent = -9
    while nanos % 1000 == 0 and exponent < 18:
        nanos //= 1000
        exponent += 3
    return f'{nanos}{_SUFFIXES[exponent]}'


@dataclasses.dataclass(frozen=True, slots=True)
class ExternalTarget:
    """A metric of the external metrics API (e.g. the Prometheus adapter's external rules)."""

    name: str
    match_labels: Mapping[str, str]
    average_value: str | None
    """Per replica (target type ``AverageValue``); exactly one of this and ``value`` is set."""
    value: str | None
    """For the whole cluster (target type ``Value``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Autoscaling:
    from_analytics: bool = False
    min_replicas: int = 1
    max_replicas: int = 10
    enabled: bool = False
    """Render a HorizontalPodAutoscaler on the cluster's scale subresource."""
    cpu_utilization: int = 70
    """Target average CPU, in percent of the broker container's CPU request."""
    connections_per_replica: int | None = None
    """Target average of the pods metric ``shoal_connections`` (custom metrics API)."""
    external: tuple[ExternalTarget, ...] = ()
    scale_down_stabilization_seconds: int = 300

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> 'Autoscaling':
        scaling = spec.get('autoscaling') or {}
        connections = scaling.get('targetConnectionsPerReplica')
        found = cls(
            from_analytics=bool(scaling.get('fromAnalytics', False)),
            min_replicas=int(scaling.get('minReplicas', 1)),
            max_replicas=int(scaling.get('maxReplicas', 10)),
            enabled=bool(scaling.get('enabled', False)),
            cpu_utilization=int(scaling.get('targetCPUUtilizationPercentage', 70)),
            connections_per_replica=None if connections is None else int(connections),
            external=tuple(_external(m) for m in scaling.get('externalMetrics') or ()),
            scale_down_stabilization_seconds=int(scaling.get('scaleDownStabilizationSeconds', 300)),
        )
        if found.min_replicas > found.max_replicas:
            raise ValueError(MIN_OVER_MAX)
        if found.enabled and found.from_analytics:
            raise ValueError(BOTH_WRITERS)
        return found


def _external(metric: Mapping[str, Any]) -> ExternalTarget:
    average, value = metric.get('averageValue'), metric.get('value')
    if (average is None) == (value is None) or not metric.get('name'):
        raise ValueError(f'{ONE_TARGET} (and a name): {dict(metric)!r}')
    return ExternalTarget(
        name=str(metric['name']),
        match_labels={str(k): str(v) for k, v in (metric.get('matchLabels') or {}).items()},
        average_value=None if average is None else canonical_quantity(str(average)),
        value=None if value is None else canonical_quantity(str(value)),
    )
