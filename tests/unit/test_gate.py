"""
A connection's open gate (``amqp/connection.Gate``) behaves as the ``asyncio.Event`` it replaces:
an attach that waits before the Open is answered resumes when it is set, and one that comes after
does not wait at all.
"""

import asyncio

from shoal_broker.amqp.connection import Gate


async def test_a_waiter_before_the_open_resumes_when_it_is_set() -> None:
    gate = Gate()
    waiters = [asyncio.create_task(gate.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not gate.is_set()
    assert not any(w.done() for w in waiters)
    gate.set()
    await asyncio.wait_for(asyncio.gather(*waiters), 5.0)
    assert gate.is_set()


async def test_a_waiter_after_the_open_does_not_wait() -> None:
    gate = Gate()
    gate.set()
    gate.set()  # set again: still set, nothing raised
    assert gate.is_set()
    await asyncio.wait_for(gate.wait(), 5.0)
