"""
What the operators of a selector do to values: SQL three-valued logic and the JMS type rules.

Exists apart from the compiler so that the rules are small, total functions that can be read
(and tested) on their own. UNKNOWN is ``None`` throughout, as is a missing identifier. No
function here raises for any operand: a value of a type the operator does not take (a string
in arithmetic, a uuid in a comparison, a float where LIKE wants a string) yields UNKNOWN.

Numbers are ``int`` and ``float`` values other than ``bool`` (subclasses such as proton's
``ulong`` or ``float32`` count); strings are ``str`` values (proton's ``symbol`` and ``char``
count). Integer arithmetic follows Java ``long`` division (truncation towards zero) but a
result outside the 64-bit range is UNKNOWN instead of wrapping around.
"""

import operator
import re
from collections.abc import Callable
from typing import TypeGuard

LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1


def is_number(v: object) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def as_truth(v: object) -> bool | None:
    """A value used as a condition: only a boolean counts, anything else is UNKNOWN."""
    return v if isinstance(v, bool) else None


# -- comparison ---------------------------------------------------------------------------------

Comparison = Callable[[object, object], bool | None]

_EQUALITY: dict[str, Callable[[object, object], bool]] = {'=': operator.eq, '<>': operator.ne}

NUMERIC: dict[str, Callable[[int | float, int | float], bool]] = {
    '<': operator.lt,
    '<=': operator.le,
    '>': operator.gt,
    '>=': operator.ge,
    '=': operator.eq,
    '<>': operator.ne,
}
"""Every operator on two numbers (always a plain bool for int and float)."""

MIRRORED = {'<': '>', '<=': '>=', '>': '<', '>=': '<=', '=': '=', '<>': '<>'}
"""The operator that gives the same answer with its operands swapped."""


def comparison(op: str) -> Comparison:
    """``a op b``: numbers with any operator; strings and booleans with = and <> only.

    NULL on either side, values of different kinds (a string and a number) and ordering of
    anything but numbers are UNKNOWN.
    """
    if op in _EQUALITY:
        equal = _EQUALITY[op]

        def equality(a: object, b: object) -> bool | None:
            if is_number(a):
                return bool(equal(a, b)) if is_number(b) else None
            if _same_kind(a, b):
                return bool(equal(a, b))
            return None

        return equality
    order = NUMERIC[op]

    def ordering(a: object, b: object) -> bool | None:
        return bool(order(a, b)) if is_number(a) and is_number(b) else None

    return ordering


def _same_kind(a: object, b: object) -> bool:
    return (isinstance(a, str) and isinstance(b, str)) or (
        isinstance(a, bool) and isinstance(b, bool)
    )


# -- logic --------------------------------------------------------------------------------------


def negate(v: object) -> bool | None:
    """SQL NOT of a truth value: UNKNOWN stays UNKNOWN."""
    return None if v is None else not v


def both(a: bool | None, b: bool | None) -> bool | None:
    """SQL AND: FALSE wins over UNKNOWN."""
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


# -- arithmetic ---------------------------------------------------------------------------------


def _long(r: int | float) -> int | float | None:
    if isinstance(r, int) and not LONG_MIN <= r <= LONG_MAX:
        return None
    return r


def _div(a: int | float, b: int | float) -> int | float:
    if b == 0:
        raise ZeroDivisionError
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return -q if (a < 0) != (b < 0) else q
    return a / b


_ARITHMETIC: dict[str, Callable[[int | float, int | float], int | float]] = {
    '+': operator.add,
    '-': operator.sub,
    '*': operator.mul,
    '/': _div,
}

Arithmetic = Callable[[object, object], int | float | None]


def arithmetic(op: str) -> Arithmetic:
    """``a op b`` on numbers; UNKNOWN for NULL, non-numbers, division by zero and overflow."""
    fn = _ARITHMETIC[op]

    def apply(a: object, b: object) -> int | float | None:
        if not (is_number(a) and is_number(b)):
            return None
        try:
            return _long(fn(int_or_float(a), int_or_float(b)))
        except ArithmeticError:
            return None

    return apply


def sign(op: str, v: object) -> int | float | None:
    """Unary ``+v`` or ``-v``; UNKNOWN unless ``v`` is a number."""
    if not is_number(v):
        return None
    n = int_or_float(v)
    return n if op == '+' else _long(-n)


def int_or_float(v: int | float) -> int | float:
    """A number as a plain int or float (drops proton's subclasses), for arithmetic."""
    return float(v) if isinstance(v, float) else int(v)


# -- LIKE ---------------------------------------------------------------------------------------


class LikePatternError(ValueError):
    """The pattern ends with its escape character."""


def like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """A test of whole strings against a LIKE pattern (``%`` any run, ``_`` any one character).

    Never a single backtracking regex: the pattern is cut at each ``%`` into fixed-length
    segments; the first must match at the start, the last at the end and the others, in order,
    at their leftmost places in between. That is exact for fixed-length segments, and each
    segment is searched for once, so no pattern can make a match take exponential time (a
    regex with several ``.*`` can, on a string that almost matches).
    """
    parts = _segments(pattern, escape)
    segments = [re.compile(regex, re.DOTALL) for regex, _ in parts]
    if len(segments) == 1:
        only = segments[0]
        return lambda s: only.fullmatch(s) is not None
    first, last, middle = segments[0], segments[-1], segments[1:-1]
    head, tail = parts[0][1], parts[-1][1]

    def matches(s: str) -> bool:
        end = len(s) - tail
        if end < head or first.match(s) is None or last.match(s, end) is None:
            return False
        pos = head
        for segment in middle:
            found = segment.search(s, pos, end)
            if found is None:
                return False
            pos = found.end()
        return True

    return matches


def _segments(pattern: str, escape: str | None) -> list[tuple[str, int]]:
    """Each ``%``-separated segment as a regex and the fixed number of characters it matches."""
    segments: list[tuple[str, int]] = []
    current: list[str] = []
    chars = iter(pattern)
    for c in chars:
        if c == escape:
            literal = next(chars, None)
            if literal is None:
                raise LikePatternError('LIKE pattern ends with its escape character')
            current.append(re.escape(literal))
        elif c == '%':
            segments.append((''.join(current), len(current)))
            current = []
        else:
            current.append('.' if c == '_' else re.escape(c))
    segments.append((''.join(current), len(current)))
    return segments
