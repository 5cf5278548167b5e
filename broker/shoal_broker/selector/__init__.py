"""
JMS 2.0 message selectors: compile the text a consumer sends (the ``jms-selector`` filter of
its source, jms-amqp-facts §2.1) once, then test each message against it.

Exists so that the broker can offer selectors on queues and subscriptions with the semantics a
JMS application expects (Jakarta Messaging 3.8.1.1), in pure Python: no I/O and no broker
imports besides ``shoal_broker.errors``. ``compile`` refuses any bad selector with a
``SelectorError`` (``amqp:invalid-field``) that names the problem and its line and column;
``Selector.matches`` never raises. ``identifiers`` (module ``headers``) builds what a selector
sees from the decoded AMQP sections.

Pipeline: ``parser`` (lark LALR, grammar in ``selector.lark``) → ``compiler`` (closures, built
once, cached per text) → ``semantics`` (three-valued logic and type rules, per message).

Semantics, where the specification leaves room (following ActiveMQ Artemis / Qpid Broker-J):

* Three-valued logic: a missing identifier or a NULL value is UNKNOWN, so is any comparison or
  arithmetic involving one; ``FALSE AND UNKNOWN`` is FALSE, ``TRUE OR UNKNOWN`` is TRUE,
  ``NOT UNKNOWN`` is UNKNOWN. A message matches only when the selector is TRUE.
* Comparing values of different kinds (a string with a number, a boolean with a number) is
  UNKNOWN. The specification says FALSE, and Artemis returns FALSE, so that there
  ``NOT (a = 1)`` and ``a <> 1`` match a message whose ``a`` is the string ``'1'``; here
  neither does: a value of the wrong kind never satisfies a comparison, in either sense. Exact
  and approximate numbers compare by value: ``1 = 1.0`` (Python's exact comparison, so very
  large longs are not rounded to doubles as in Java).
* Strings and booleans support only ``=`` and ``<>`` (specification); ``<``, ``<=``, ``>``,
  ``>=`` on them are UNKNOWN at run time, never a compile error (Artemis refuses a string
  literal there at parse time but orders two string properties lexically).
* ``x BETWEEN a AND b`` is ``x >= a AND x <= b`` with those rules: ``'x' BETWEEN 1 AND 2`` is
  UNKNOWN, not an error.
* Arithmetic takes numbers only. On a literal string or condition it is refused at compile time
  (``'a' + 1``); on an identifier holding something else it is UNKNOWN. Integer division
  truncates towards zero (Java ``long``); division by zero is UNKNOWN (not Java's Infinity);
  an integer result outside the 64-bit range is UNKNOWN (Java would wrap around).
* ``IN`` lists may hold string and numeric literals (the specification and Artemis allow
  strings only; numbers, possibly signed, are an extension). ``x IN (...)`` is the OR of
  ``x = item``: UNKNOWN for NULL or a value of a kind absent from the list, TRUE on a match,
  else FALSE. ``NOT IN`` is its NOT.
* ``LIKE`` needs a string literal pattern (``%`` any run, ``_`` one character) and an optional
  one-character ``ESCAPE``; every other character, regex metacharacters included, matches
  itself. The escape character makes the next character literal whatever it is; a pattern
  ending with it is refused. A value that is not a string is UNKNOWN.
* ``IS NULL`` is TRUE for a missing identifier or a None value; ``IS NOT NULL`` its negation.
* An identifier used as a condition (``a AND b``, or a whole selector ``flag``) is TRUE or
  FALSE when it holds a boolean and UNKNOWN otherwise. A numeric or string literal or an
  arithmetic expression where a condition is needed (``1 AND a``, ``a + 1``) is refused.
* Literals: strings in single quotes with ``''`` for a quote; decimal, hex (``0x1F``) and octal
  (``017``) integers with an optional ``L``, limited to the 64-bit range (``-9223372036854775808``
  included); approximate numbers ``1.5``, ``.5``, ``1.``, ``1e3``, ``1.5E-2`` with an optional
  ``f``/``d`` suffix, finite only; ``TRUE``/``FALSE``. Keywords (NOT AND OR BETWEEN LIKE IN IS
  NULL ESCAPE TRUE FALSE) are case-insensitive and never identifiers; identifiers (Java
  letters, digits, ``_`` and ``$``) are case-sensitive. As in Artemis a double-quoted
  identifier may hold any characters: ``"m.x-opt-foo" = 1``.
* A blank selector (empty or white space) matches every message: JMS treats an empty selector
  as none, and so does Artemis.
* Limits: 64 KiB of UTF-8 text, 16 384 tokens and 128 levels of nesting (parentheses, NOT,
  signs, operators; flat chains such as ``a OR b OR c`` count once), so no selector can exhaust
  the stack, and none costs more than a few hundred milliseconds to compile. Too many tokens or
  parentheses are refused by a cheap scan before the parser runs.

Compiling is pure CPU work proportional to the text; ``compile`` caches the outcome of the last
``CACHE_SIZE`` distinct texts, refusals included, so a text sent again costs a dictionary
look-up. The broker compiles long texts in a worker thread (``amqp/selector_offload.py``), so
that its event loop never waits for one.
"""

import collections
import threading

from shoal_broker.selector.headers import identifiers
from shoal_broker.selector.limits import (
    MAX_DEPTH,
    MAX_LENGTH,
    MAX_TOKENS,
    Evaluate,
    Identifiers,
    SelectorError,
)

__all__ = [
    'MAX_DEPTH',
    'MAX_LENGTH',
    'MAX_TOKENS',
    'Selector',
    'SelectorError',
    'cached',
    'compilations',
    'compile',
    'identifiers',
]

CACHE_SIZE = 1024


class Selector:
    """A compiled selector. ``text`` is its source; ``matches`` tests one message."""

    __slots__ = ('_evaluate', 'text')

    def __init__(self, text: str, evaluate: Evaluate) -> None:
        self.text = text
        self._evaluate = evaluate

    def matches(self, identifiers: Identifiers) -> bool:
        """True only when the selector is TRUE for these identifiers (FALSE or UNKNOWN: False).

        Never raises: the evaluator handles every value type, and should it fail anyway the
        message is treated as not matching rather than breaking dispatch.
        """
        try:
            return self._evaluate(identifiers) is True
        except Exception:
            return False

    def __repr__(self) -> str:
        return f'Selector({self.text!r})'


_cache: collections.OrderedDict[str, Selector | str] = collections.OrderedDict()
"""Recently compiled texts: the Selector, or the message of the SelectorError refusing it."""
_cache_lock = threading.Lock()
_compilations = 0


def compilations() -> int:
    """How many texts were compiled (parsed) so far: cache hits are not counted."""
    return _compilations


def cached(text: str) -> Selector | None:
    """The selector for ``text`` when its outcome is cached (SelectorError if refused), else
    None: a look-up that never parses."""
    with _cache_lock:
        outcome = _cache.get(text)
        if outcome is not None:
            _cache.move_to_end(text)
    if isinstance(outcome, str):
        raise SelectorError(outcome)
    return outcome


def compile(text: str) -> Selector:
    """The selector for ``text``, compiled once per distinct text; SelectorError if invalid."""
    if not isinstance(text, str):
        raise SelectorError(f'a selector must be a string, not {type(text).__name__}')
    selector = cached(text)
    if selector is not None:
        return selector
    global _compilations
    with _cache_lock:
        _compilations += 1
    # lark comes in with the first selector compiled: a broker without selectors never imports
    # it (limits.py); the cache above answers every text seen before without these look-ups
    from shoal_broker.selector.compiler import compile_condition
    from shoal_broker.selector.parser import parse

    try:
        tree = parse(text)
        evaluate = _always if tree is None else compile_condition(tree)
        outcome: Selector | str = Selector(text, evaluate)
    except SelectorError as e:
        outcome = str(e)
    with _cache_lock:
        _cache[text] = outcome
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    if isinstance(outcome, str):
        raise SelectorError(outcome)
    return outcome


def _always(_identifiers: Identifiers) -> bool:
    return True
