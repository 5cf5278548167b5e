"""Sending one pipeline on a store ``Lane`` from a test, its replies as a future."""

import asyncio
from typing import Any

from shoal_broker.store.lane import Lane


async def send(lane: Lane, commands: list[tuple[Any, ...]]) -> 'asyncio.Future[list[Any]]':
    """One pipeline, its replies as a future."""
    future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()

    def answer(replies: list[Any] | None, error: BaseException | None) -> None:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(replies or [])

    await lane.send_then(commands, answer)
    return future
