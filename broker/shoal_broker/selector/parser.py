"""
Text to parse tree: the lark LALR parser for selector.lark, and every way a selector is refused.

Exists so that the rest of the package never sees a lark exception: any input (too long, an
unknown character, a misplaced token, nesting too deep) becomes a ``SelectorError`` that names
the problem and its line and column, which the protocol edge reports as ``amqp:invalid-field``.
The grammar is read with importlib.resources so it ships inside the wheel next to this module.
"""

import functools
import re
from importlib import resources

from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from shoal_broker.errors import InvalidField

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


@functools.cache
def _parser() -> Lark:
    grammar_file = resources.files('shoal_broker.selector').joinpath('selector.lark')
    grammar = grammar_file.read_text(encoding='utf-8')
    return Lark(
        grammar,
        parser='lalr',
        lexer='basic',
        propagate_positions=True,
        maybe_placeholders=False,
    )


def parse(text: str) -> Tree[Token] | None:
    """The parse tree of ``text``, or None when it is blank (no selector at all)."""
    if not isinstance(text, str):
        raise SelectorError(f'a selector must be a string, not {type(text).__name__}')
    if len(text) * 4 > MAX_LENGTH and len(text.encode('utf-8', 'surrogatepass')) > MAX_LENGTH:
        raise SelectorError(f'selector is longer than {MAX_LENGTH} bytes')
    if not text.strip():
        return None
    precheck(text)
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as e:
        raise SelectorError(_describe(text, e)) from None
    except LarkError as e:  # pragma: no cover - lark reports input errors above
        raise SelectorError(f'invalid selector: {e}') from None
    _check_depth(tree)
    return tree


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


_EXPECTED = {
    'STRING': 'a string literal',
    'NUMBER': 'a number',
    'IDENT': 'an identifier',
    'QUOTED_IDENT': 'a quoted identifier',
    'COMPARE': 'a comparison',
    'ADDOP': '+ or -',
    'MULOP': '* or /',
    'LPAR': "'('",
    'RPAR': "')'",
    'COMMA': "','",
}
_MAX_EXPECTED = 4
"""Above this many possibilities, naming them helps nobody."""


def _describe(text: str, e: UnexpectedInput) -> str:
    if isinstance(e, UnexpectedCharacters):
        pos = e.pos_in_stream
        char = text[pos] if pos is not None and 0 <= pos < len(text) else ''
        if char in ('"', "'"):
            return f'unterminated quoted text {at(e.line, e.column)}'
        return f'unexpected character {shown(char)} {at(e.line, e.column)}'
    if isinstance(e, UnexpectedToken) and e.token.type != '$END':
        return f'unexpected {shown(str(e.token))} {at(e.line, e.column)}{_expected(e)}'
    line = text.count('\n') + 1
    column = len(text) - text.rfind('\n')
    return f'unexpected end of selector {at(line, column)}{_expected(e)}'


def _expected(e: UnexpectedInput) -> str:
    names = sorted(getattr(e, 'expected', None) or ())
    if not names or len(names) > _MAX_EXPECTED:
        return ''
    return ' (expected ' + ' or '.join(_EXPECTED.get(n, n.lstrip('_')) for n in names) + ')'


def _check_depth(tree: Tree[Token]) -> None:
    """Refuse trees nested deeper than MAX_DEPTH, without recursing."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            where = at(node.meta.line, node.meta.column) if not node.meta.empty else ''
            raise SelectorError(f'selector nested deeper than {MAX_DEPTH} levels {where}'.strip())
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, Tree))
