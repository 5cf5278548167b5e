"""
Parse tree to evaluator: nested Python closures built once per selector, run once per message.

Exists because a selector runs for every message and every subscription: walking the lark tree
per message would cost a dispatch per node and per message. Here each node becomes a closure
over its already-compiled operands, literals are decoded once, sub-expressions made only of
literals are folded into constants, and the common ``identifier <op> literal`` comparisons get
closures of their own.

It is also where the type errors visible in the text are refused, with their position. Every
expression has a static kind: a condition (comparisons, AND, TRUE...), a number (numeric
literals, arithmetic), a string literal, or ANY (an identifier, known only per message). A
condition is required by AND, OR, NOT and the selector as a whole; a number by + - * / and the
signs; ANY is accepted everywhere. Comparisons, BETWEEN, IN, LIKE and IS NULL take operands of
any kind and settle mismatches per message (UNKNOWN), as JMS defines them.
"""

import dataclasses
import enum
import math
from collections.abc import Callable, Sequence

from lark import Token, Tree

from shoal_broker.selector import semantics
from shoal_broker.selector.limits import Evaluate, Identifiers, SelectorError, at, shown

_NO_IDENTIFIERS: Identifiers = {}


class Kind(enum.Enum):
    CONDITION = 'a condition'
    NUMBER = 'a number'
    STRING = 'a string'
    ANY = 'an identifier'


@dataclasses.dataclass(frozen=True, slots=True)
class _Node:
    run: Evaluate
    kind: Kind
    constant: bool = False
    name: str | None = None
    """The identifier this node looks up, if it is one: lets hot closures skip a call."""


def _constant(value: object, kind: Kind) -> _Node:
    return _Node(lambda _ids: value, kind, constant=True)


def _made(run: Evaluate, kind: Kind, operands: Sequence[_Node]) -> _Node:
    """A node over ``operands``; folded into a constant when every operand is one."""
    if operands and all(o.constant for o in operands):
        return _constant(run(_NO_IDENTIFIERS), kind)
    return _Node(run, kind)


def compile_condition(tree: Tree[Token]) -> Evaluate:
    """The evaluator of a whole selector: True, False or None (UNKNOWN) for a message."""
    return _condition(tree).run


def _where(item: Tree[Token] | Token) -> str:
    if isinstance(item, Token):
        return at(item.line or 0, item.column or 0)
    return '' if item.meta.empty else at(item.meta.line, item.meta.column)


def _compile(tree: Tree[Token]) -> _Node:
    return _RULES[tree.data](tree)


def _subtree(item: Tree[Token] | Token) -> Tree[Token]:
    assert isinstance(item, Tree), item  # the grammar puts only trees in operand positions
    return item


def _token(item: Tree[Token] | Token) -> Token:
    assert isinstance(item, Token), item  # the grammar puts only tokens in these positions
    return item


def _condition(tree: Tree[Token] | Token) -> _Node:
    """An operand of AND, OR, NOT or the whole selector; its evaluator returns a truth value."""
    node = _compile(_subtree(tree))
    if node.kind is Kind.CONDITION:
        return node
    if node.kind is Kind.ANY:
        run = node.run
        return _Node(lambda ids: semantics.as_truth(run(ids)), Kind.CONDITION)
    raise SelectorError(f'expected a condition, found {node.kind.value} {_where(tree)}')


def _operand(tree: Tree[Token] | Token) -> _Node:
    return _compile(_subtree(tree))


def _numeric(tree: Tree[Token] | Token) -> _Node:
    """An operand of arithmetic: a number or an identifier."""
    node = _operand(tree)
    if node.kind not in (Kind.NUMBER, Kind.ANY):
        raise SelectorError(f'arithmetic on {node.kind.value} {_where(tree)}')
    return node


# -- logic --------------------------------------------------------------------------------------


def _junction(tree: Tree[Token], decisive: bool) -> _Node:
    """OR (``decisive`` True) or AND (False) in SQL three-valued logic: the decisive value wins
    at once; otherwise any UNKNOWN makes the result UNKNOWN."""
    nodes = [_condition(c) for c in tree.children]
    parts = [n.run for n in nodes]

    def run(ids: Identifiers) -> bool | None:
        result: bool | None = not decisive
        for part in parts:
            v = part(ids)
            if v is decisive:
                return decisive
            if v is None:
                result = None
        return result

    return _made(run, Kind.CONDITION, nodes)


def _or(tree: Tree[Token]) -> _Node:
    return _junction(tree, True)


def _and(tree: Tree[Token]) -> _Node:
    return _junction(tree, False)


def _not(tree: Tree[Token]) -> _Node:
    node = _condition(tree.children[0])
    part = node.run
    return _made(lambda ids: semantics.negate(part(ids)), Kind.CONDITION, (node,))


# -- predicates ---------------------------------------------------------------------------------


def _comparison(tree: Tree[Token]) -> _Node:
    left_tree, op_token, right_tree = tree.children
    left, right = _operand(left_tree), _operand(right_tree)
    op = str(_token(op_token))
    if left.constant and not right.constant:
        left, right, op = right, left, semantics.MIRRORED[op]
    if right.constant and not left.constant:
        return _Node(_against_constant(left, op, right.run(_NO_IDENTIFIERS)), Kind.CONDITION)
    compare = semantics.comparison(op)
    lrun, rrun = left.run, right.run
    return _made(lambda ids: compare(lrun(ids), rrun(ids)), Kind.CONDITION, (left, right))


def _against_constant(left: _Node, op: str, value: object) -> Evaluate:
    """``left op value`` for a literal ``value``: the common case, given short closures."""
    name = left.name
    if name is None:
        compare = semantics.comparison(op)
        run = left.run
        return lambda ids: compare(run(ids), value)
    if isinstance(value, str) and op == '=':
        return lambda ids: (v == value) if isinstance(v := ids.get(name), str) else None
    if isinstance(value, str) and op == '<>':
        return lambda ids: (v != value) if isinstance(v := ids.get(name), str) else None
    if semantics.is_number(value):
        order = semantics.NUMERIC[op]
        return lambda ids: (
            order(v, value)
            if isinstance(v := ids.get(name), (int, float)) and not isinstance(v, bool)
            else None
        )
    compare = semantics.comparison(op)
    return lambda ids: compare(ids.get(name), value)


def _between(tree: Tree[Token]) -> _Node:
    value, low, high = (_operand(c) for c in tree.children)
    run, lo_run, hi_run = value.run, low.run, high.run
    at_least = semantics.comparison('>=')
    at_most = semantics.comparison('<=')
    if low.constant and high.constant:
        lo, hi = lo_run(_NO_IDENTIFIERS), hi_run(_NO_IDENTIFIERS)
        if semantics.is_number(lo) and semantics.is_number(hi):
            is_number = semantics.is_number
            return _made(
                lambda ids: (lo <= v <= hi) if is_number(v := run(ids)) else None,
                Kind.CONDITION,
                (value,),
            )

    def between(ids: Identifiers) -> bool | None:
        v = run(ids)
        return semantics.both(at_least(v, lo_run(ids)), at_most(v, hi_run(ids)))

    return _made(between, Kind.CONDITION, (value, low, high))


def _is_null(tree: Tree[Token]) -> _Node:
    value = _operand(tree.children[0])
    run = value.run
    return _made(lambda ids: run(ids) is None, Kind.CONDITION, (value,))


def _negated(rule: Callable[[Tree[Token]], _Node]) -> Callable[[Tree[Token]], _Node]:
    """The rule for ``NOT BETWEEN``, ``NOT LIKE``, ``NOT IN``, ``IS NOT NULL``."""

    def negated(tree: Tree[Token]) -> _Node:
        node = rule(tree)
        run = node.run
        return _made(lambda ids: semantics.negate(run(ids)), Kind.CONDITION, (node,))

    return negated


def _like(tree: Tree[Token]) -> _Node:
    value = _operand(tree.children[0])
    pattern = _string_value(_token(tree.children[1]))
    escape = _escape(_subtree(tree.children[2])) if len(tree.children) > 2 else None
    try:
        matcher = semantics.like_matcher(pattern, escape)
    except semantics.LikePatternError as e:
        raise SelectorError(f'{e} {_where(tree.children[1])}') from None
    run = value.run
    return _made(
        lambda ids: matcher(v) if isinstance(v := run(ids), str) else None,
        Kind.CONDITION,
        (value,),
    )


def _escape(tree: Tree[Token]) -> str:
    token = _token(tree.children[0])
    escape = _string_value(token)
    if len(escape) != 1:
        raise SelectorError(
            f'ESCAPE needs exactly one character, not {shown(escape)} {_where(token)}'
        )
    return escape


def _in(tree: Tree[Token]) -> _Node:
    value = _operand(tree.children[0])
    items = [_literal_item(_subtree(c)) for c in tree.children[1:]]
    strings = frozenset(i for i in items if isinstance(i, str))
    numbers = frozenset(i for i in items if not isinstance(i, str))
    run = value.run
    is_number = semantics.is_number

    def contains(ids: Identifiers) -> bool | None:
        v = run(ids)
        if isinstance(v, str):
            return True if v in strings else (None if numbers else False)
        if is_number(v):
            return True if v in numbers else (None if strings else False)
        return None

    return _made(contains, Kind.CONDITION, (value,))


def _literal_item(tree: Tree[Token]) -> str | int | float:
    if tree.data == 'string':
        return _string_value(_token(tree.children[0]))
    if tree.data == 'number':
        return _number_value(_token(tree.children[0]), negative=False)
    sign, number = (_token(c) for c in tree.children)
    return _number_value(number, negative=sign == '-')


# -- arithmetic ---------------------------------------------------------------------------------


def _chain(tree: Tree[Token]) -> _Node:
    """``a + b - c`` or ``a * b / c``: a flat chain of operands and operators, left to right."""
    operands = [_numeric(c) for c in tree.children[0::2]]
    ops = [semantics.arithmetic(str(_token(t))) for t in tree.children[1::2]]
    first = operands[0].run
    if len(operands) == 2:
        op, second = ops[0], operands[1].run
        return _made(lambda ids: op(first(ids), second(ids)), Kind.NUMBER, operands)
    rest = list(zip(ops, (o.run for o in operands[1:]), strict=True))

    def run(ids: Identifiers) -> object:
        acc = first(ids)
        for op, operand in rest:
            if acc is None:
                return None
            acc = op(acc, operand(ids))
        return acc

    return _made(run, Kind.NUMBER, operands)


def _signed(tree: Tree[Token]) -> _Node:
    sign = str(_token(tree.children[0]))
    target = _subtree(tree.children[1])
    if target.data == 'number':
        value = _number_value(_token(target.children[0]), negative=sign == '-')
        return _constant(value, Kind.NUMBER)
    operand = _numeric(target)
    run = operand.run
    return _made(lambda ids: semantics.sign(sign, run(ids)), Kind.NUMBER, (operand,))


# -- primaries ----------------------------------------------------------------------------------


def _ident(tree: Tree[Token]) -> _Node:
    return _identifier(str(_token(tree.children[0])))


def _identifier(name: str) -> _Node:
    return _Node(lambda ids: ids.get(name), Kind.ANY, name=name)


def _quoted_ident(tree: Tree[Token]) -> _Node:
    token = _token(tree.children[0])
    name = token[1:-1].replace('""', '"')
    if not name:
        raise SelectorError(f'empty quoted identifier {_where(token)}')
    return _identifier(name)


def _string(tree: Tree[Token]) -> _Node:
    return _constant(_string_value(_token(tree.children[0])), Kind.STRING)


def _number(tree: Tree[Token]) -> _Node:
    return _constant(_number_value(_token(tree.children[0]), negative=False), Kind.NUMBER)


def _paren(tree: Tree[Token]) -> _Node:
    return _operand(tree.children[0])


def _string_value(token: Token) -> str:
    return token[1:-1].replace("''", "'")


_LONG_DIGITS = 22
"""More significant digits than any 64-bit integer literal needs, in any base."""


def _number_value(token: Token, *, negative: bool) -> int | float:
    """A numeric literal: hex, octal or decimal with an optional L, or approximate."""
    text = str(token)
    if text[:2] in ('0x', '0X'):
        value = _exact(text[2:], 16, token)
    elif any(c in text for c in '.eEfFdD'):
        approximate = float(text.rstrip('fFdD'))
        if not math.isfinite(approximate):
            raise SelectorError(f'number {shown(text)} out of range {_where(token)}')
        return -approximate if negative else approximate
    elif len(text.rstrip('lL')) > 1 and text.startswith('0'):
        value = _exact(text[1:], 8, token)
    else:
        value = _exact(text, 10, token)
    value = -value if negative else value
    if not semantics.LONG_MIN <= value <= semantics.LONG_MAX:
        raise SelectorError(f'integer {shown(text)} out of the 64-bit range {_where(token)}')
    return value


def _exact(digits: str, base: int, token: Token) -> int:
    digits = digits[:-1] if digits[-1:] in ('l', 'L') else digits
    if len(digits.lstrip('0')) > _LONG_DIGITS:
        raise SelectorError(f'integer {shown(str(token))} out of the 64-bit range {_where(token)}')
    try:
        return int(digits, base)
    except ValueError:
        raise SelectorError(f'invalid octal number {shown(str(token))} {_where(token)}') from None


def _literal(value: object) -> Callable[[Tree[Token]], _Node]:
    return lambda _tree: _constant(value, Kind.CONDITION)


_RULES: dict[str, Callable[[Tree[Token]], _Node]] = {
    'or_expr': _or,
    'and_expr': _and,
    'negation': _not,
    'comparison': _comparison,
    'between': _between,
    'not_between': _negated(_between),
    'like': _like,
    'not_like': _negated(_like),
    'in': _in,
    'not_in': _negated(_in),
    'is_null': _is_null,
    'is_not_null': _negated(_is_null),
    'sum': _chain,
    'product': _chain,
    'signed': _signed,
    'ident': _ident,
    'quoted_ident': _quoted_ident,
    'string': _string,
    'number': _number,
    'true': _literal(True),
    'false': _literal(False),
    'paren': _paren,
}
