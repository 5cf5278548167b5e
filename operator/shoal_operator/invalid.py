"""
The error of a resource that cannot be acted on as written, in a leaf module so that the parsers
of a spec's sections (``models.py``, ``last_value.py``, ``duplicates.py``) share it, and the
bounds check that raises it, without importing each other.
"""

from collections.abc import Mapping
from typing import Any


class InvalidSpec(ValueError):
    """The resource cannot be acted on as written; retrying will not help."""


def bounded(section: Mapping[str, Any], field: str, low: int, high: int) -> int | None:
    value = section.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidSpec(f'{field} must be an integer from {low} to {high}, not {value!r}')
    return value
