"""
Text to parse tree: the lark LALR parser for selector.lark, and every way a selector is refused.

Exists so that the rest of the package never sees a lark exception: any input (too long, an
unknown character, a misplaced token, nesting too deep) becomes a ``SelectorError`` that names
the problem and its line and column, which the protocol edge reports as ``amqp:invalid-field``.
The grammar is read with importlib.resources so it ships inside the wheel next to this module.
"""

import functools
from importlib import resources

from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from shoal_broker.selector.limits import (
    MAX_DEPTH,
    MAX_LENGTH,
    MAX_TOKENS,
    SelectorError,
    at,
    precheck,
    shown,
)

__all__ = [
    'MAX_DEPTH', 'MAX_LENGTH', 'MAX_TOKENS', 'SelectorError', 'at', 'parse', 'precheck', 'shown',
]  # fmt: skip


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
