"""Background tasks stop even when one swallows a cancellation (as Python 3.11's wait_for can)."""

import asyncio
import contextlib

from shoal_broker.stopping import cancel_and_wait


async def test_a_task_that_swallows_the_first_cancellation_still_stops() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:  # a loop around a call that lost the cancel, like redis-py's write on 3.11
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(30)
                continue
            swallowed += 1
            if swallowed >= 3:
                break
            await asyncio.sleep(0)  # goes round again, as if nothing had happened

    obedient = asyncio.create_task(asyncio.sleep(30))
    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    async with asyncio.timeout(10):
        await cancel_and_wait([task, obedient])
    assert task.done()
    assert obedient.cancelled()
    assert swallowed == 3  # cancelled again and again until it ended


async def test_finished_tasks_are_left_as_they_are() -> None:
    done = asyncio.create_task(asyncio.sleep(0, result='kept'))
    await done
    await cancel_and_wait([done])
    assert done.result() == 'kept'
