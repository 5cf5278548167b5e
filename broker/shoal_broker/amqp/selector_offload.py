"""
Compiling selectors without stopping an event loop: long texts go to one worker thread.

Exists because compiling is pure-Python work proportional to the text (up to a few hundred
milliseconds at the limits) and the broker's event loop serves every client of the replica:
it must never stop for that long. Short texts (nearly all real selectors) and cached outcomes
are answered on the loop at once; longer ones are compiled by a single worker thread, one at a
time, the same text only once however many attaches wait for it, and at most ``MAX_WAITING``
distinct texts queued (past that the attach is refused with ``amqp:resource-limit-exceeded``).

A thread rather than a process: the compiled selector is a tree of closures that cannot cross
a process boundary. The worker holds the GIL while it computes, so the process should use a
short switch interval (``SWITCH_INTERVAL_SECONDS``, set by the broker at start): the loop
then waits at most that long for the GIL after each system call instead of CPython's default
5 ms, which measured as stalls of several hundred milliseconds under a busy worker.
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor

from shoal_broker.errors import ResourceLimitExceeded
from shoal_broker.selector import Selector, cached, compile

INLINE_LENGTH = 256
"""Texts up to this many characters are compiled on the caller's loop (well under 1 ms)."""

MAX_WAITING = 64
"""Distinct long texts that may wait for the worker at once."""

SWITCH_INTERVAL_SECONDS = 0.0005
"""The GIL switch interval the broker sets (``sys.setswitchinterval``)."""

_pool: ThreadPoolExecutor | None = None
_waiting: dict[str, 'asyncio.Future[Selector]'] = {}


async def compile_off_loop(text: str) -> Selector:
    """``selector.compile(text)`` without blocking the running loop for more than a cached
    look-up or a short text; SelectorError if invalid, ResourceLimitExceeded if too many
    texts wait for the worker."""
    if len(text) <= INLINE_LENGTH:
        return compile(text)
    selector = cached(text)
    if selector is not None:
        return selector
    future = _waiting.get(text)
    if future is None:
        if len(_waiting) >= MAX_WAITING:
            raise ResourceLimitExceeded(
                f'{MAX_WAITING} long selectors are already waiting to be compiled'
            )
        global _pool
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix='selector')
        future = asyncio.get_running_loop().run_in_executor(_pool, compile, text)
        _waiting[text] = future
        future.add_done_callback(lambda done: _finished(text, done))
    # shielded: an attach given up (its connection closed) leaves the compilation to the others
    return await asyncio.shield(future)


def _finished(text: str, future: 'asyncio.Future[Selector]') -> None:
    _waiting.pop(text, None)
    if not future.cancelled():
        future.exception()  # retrieved here: every waiter may have gone
