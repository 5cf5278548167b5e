"""
What one user may do, as address patterns per operation.

Operations: ``send`` (attach a producer to the address, or relay a message to it), ``consume``
(receive from a queue or subscribe to a topic; implies ``browse``), ``browse`` (a queue browser),
``manage`` (create or delete a durable subscription on the topic). A pattern is an address where
``*`` stands for any run of characters (dots included); everything else matches itself. No
pattern, no permission: an empty entry may do nothing.
"""

import enum
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any


class Operation(enum.StrEnum):
    SEND = 'send'
    CONSUME = 'consume'
    BROWSE = 'browse'
    MANAGE = 'manage'


_IMPLIED = {Operation.BROWSE: (Operation.BROWSE, Operation.CONSUME)}


def _compile(patterns: Iterable[str]) -> re.Pattern[str] | None:
    parts = ['.*'.join(map(re.escape, p.split('*'))) for p in patterns]
    return re.compile('|'.join(f'(?:{p})' for p in parts)) if parts else None


class Permissions:
    """Immutable; answers are cached per (operation, address) since producers ask per message."""

    def __init__(self, patterns: Mapping[Operation, tuple[str, ...]]) -> None:
        self.patterns = {op: tuple(patterns.get(op, ())) for op in Operation}
        self._compiled = {op: _compile(p) for op, p in self.patterns.items()}
        self.allows = functools.lru_cache(maxsize=4096)(self._allows)

    @classmethod
    def none(cls) -> 'Permissions':
        return cls({})

    @classmethod
    def everything(cls) -> 'Permissions':
        return cls({op: ('*',) for op in Operation})

    @classmethod
    def parse(cls, value: Any, where: str) -> 'Permissions':
        if not isinstance(value, dict):
            raise ValueError(f'{where}: permissions must be an object')
        patterns: dict[Operation, tuple[str, ...]] = {}
        for key, items in value.items():
            try:
                op = Operation(key)
            except ValueError:
                known = ', '.join(Operation)
                raise ValueError(f'{where}: unknown operation {key!r} (known: {known})') from None
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise ValueError(f'{where}: {key} must be a list of address patterns')
            patterns[op] = tuple(items)
        return cls(patterns)

    def to_json(self) -> dict[str, list[str]]:
        return {op.value: list(p) for op, p in self.patterns.items() if p}

    def _allows(self, operation: Operation, address: str) -> bool:
        for op in _IMPLIED.get(operation, (operation,)):
            compiled = self._compiled[op]
            if compiled is not None and compiled.fullmatch(address):
                return True
        return False
