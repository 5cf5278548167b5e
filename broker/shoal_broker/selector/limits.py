"""
What a selector may be and how a refusal reads: the size limits, ``SelectorError`` and the
cheap scan run before the parser.

Kept apart from ``parser.py`` so that they cost no lark import: the broker imports this
package at start, and lark (~1.5 MiB of RSS, docs/performance.md "Idle memory") only when a
first selector is compiled (``compile`` in ``__init__.py``).
"""

import re
from collections.abc import Callable, Mapping

from shoal_broker.errors import InvalidField

Identifiers = Mapping[str, object]
"""What a selector reads from a message: its headers and properties by name."""

Evaluate = Callable[[Identifiers], object]
"""A compiled selector (``compiler.compile_condition``): True, False or None (UNKNOWN)."""

MAX_LENGTH = 64 * 1024
"""Longest selector accepted, in UTF-8 bytes."""

MAX_DEPTH = 128
"""Deepest nesting of parse-tree nodes (parentheses, NOT, unary signs, operators) accepted.

Compiling and evaluating recurse once per level; the bound keeps both far from Python's
recursion limit. Flat chains (``a OR b OR c ...``, ``1 + 2 + 3 ...``) count as one level."""

MAX_TOKENS = 16_384
"""Most tokens (identifiers, literals, keywords, operators, parentheses) a selector may hold.

Parsing and compiling cost about the same per token, so this bounds the work one selector can
ask for (a few hundred milliseconds of a worker thread at 64 KiB) while leaving room for long
``IN`` lists and ``OR`` chains (3 000 ``a = n`` terms are 12 000 tokens)."""

_TOKEN = re.compile(r"""'[^']*(?:''[^']*)*'?|"[^"]*(?:""[^"]*)*"?|[\w$.]+|<>|<=|>=|\S""")
"""A cheap count of the lexer's tokens: quoted texts, words and numbers, then any other character.
It counts more where the two differ (``1.5E-2`` is three here), fewer only where the lexer's
tokens run together (``1.2.3``), which the parser refuses at once as a syntax error."""

_SHOWN = 40
"""Longest piece of the selector quoted back in an error message."""


class SelectorError(InvalidField):
    """A JMS message selector that cannot be compiled (syntax, literal, type or size)."""


def precheck(text: str) -> None:
    """Refuse, in a few milliseconds even at 64 KiB, what would cost the parser far more: too
    many tokens, or parentheses nested deeper than MAX_DEPTH (the parser then finds the rest)."""
    if text.count('(') > MAX_DEPTH:
        depth = 0
        for token in _TOKEN.findall(text):
            if token == '(':
                depth += 1
                if depth > MAX_DEPTH:
                    raise SelectorError(f'selector nested deeper than {MAX_DEPTH} levels')
            elif token == ')':
                depth -= 1
    if len(text) > MAX_TOKENS and _TOKEN.subn('', text)[1] > MAX_TOKENS:
        raise SelectorError(f'selector has more than {MAX_TOKENS} tokens')


def at(line: int, column: int) -> str:
    """The position suffix used by every message: line and column, both counted from 1."""
    return f'at line {line}, column {column}'


def shown(piece: str) -> str:
    """``piece`` quoted for an error message, cut short when long."""
    if len(piece) > _SHOWN:
        piece = piece[:_SHOWN] + '...'
    return repr(piece)
