"""
Status conditions in the exact ``metav1.Condition`` shape, and the ``Ready`` summary.

Pure: the clock is a parameter. ``lastTransitionTime`` moves only when a condition's status flips,
so repeated reconciles do not churn the status; every condition carries the generation it was
computed for.
"""

import datetime
from collections.abc import Iterable, Sequence
from typing import Any, Literal, TypedDict

Status = Literal['True', 'False', 'Unknown']


class Condition(TypedDict):
    type: str
    status: Status
    reason: str
    message: str
    lastTransitionTime: str
    observedGeneration: int


def timestamp(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


def make_condition(
    type_: str,
    ok: bool | None,
    *,
    reason: str,
    message: str = '',
    generation: int,
    previous: Sequence[Any],
    now: datetime.datetime,
) -> Condition:
    """One condition; ``ok=None`` is ``Unknown``."""
    status: Status = 'Unknown' if ok is None else 'True' if ok else 'False'
    before = next((c for c in previous if c.get('type') == type_), None)
    unchanged = before is not None and before.get('status') == status
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        lastTransitionTime=(
            str(before.get('lastTransitionTime'))
            if before is not None and unchanged
            else timestamp(now)
        ),
        observedGeneration=generation,
    )


def merged(previous: Sequence[Any], updates: Iterable[Condition]) -> list[Condition]:
    """``previous`` with ``updates`` replacing conditions of the same type, sorted by type (a
    merge-patch replaces the whole list, so the full list is always written)."""
    by_type: dict[str, Any] = {c['type']: c for c in previous if 'type' in c}
    for condition in updates:
        by_type[condition['type']] = condition
    return [by_type[t] for t in sorted(by_type)]


def without(conditions: Sequence[Condition], type_: str) -> list[Condition]:
    return [c for c in conditions if c['type'] != type_]


def ready(
    blockers: Sequence[tuple[str, str]],
    *,
    generation: int,
    previous: Sequence[Any],
    now: datetime.datetime,
    ok_reason: str,
    ok_message: str = '',
) -> Condition:
    """The summary: True with ``ok_reason`` unless there is a blocker (reason, message); the first
    blocker explains ``False``."""
    if blockers:
        reason, message = blockers[0]
        return make_condition(
            'Ready', False, reason=reason, message=message, generation=generation,
            previous=previous, now=now,
        )  # fmt: skip
    return make_condition(
        'Ready', True, reason=ok_reason, message=ok_message, generation=generation,
        previous=previous, now=now,
    )  # fmt: skip


def is_true(conditions: Sequence[Any], type_: str) -> bool:
    return any(c.get('type') == type_ and c.get('status') == 'True' for c in conditions)
