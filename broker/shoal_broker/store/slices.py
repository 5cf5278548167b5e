"""
Background passes' calls sent in slices: at most ``CALLS_PER_PIPELINE`` calls to a pipeline and
one pipeline per node at a time, so that the event loop serves clients between pipelines
(docs/performance.md#background-work-in-slices).

Each call touches one key's slot and goes to the primary serving it through that node's plain
client (``commit_nodes.NodeClients``): on standalone and Sentinel the one server, on a cluster one
client per primary, whose pipelines take scripts where the cluster client's do not. The nodes are
served side by side, each by its own pipelines one after the other, packed and read by hiredis
(``packed.py``).
"""

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.asyncio

from shoal_broker.store import packed
from shoal_broker.store.commit_nodes import NOTHING_RAN, NodeClients
from shoal_broker.store.lane import CONNECTION_ERRORS

CALLS_PER_PIPELINE = 100
"""Calls per pipeline of a background pass (trim.lua calls, the index checks and deletions of big
messages' bodies): a trim step's reply is read and judged on the loop, so a pass over a thousand
addresses in one pipeline held every connection's traffic at once. Metric records have their own
slice (``reporting.RECORDS_PER_SLICE``): building one costs the loop far more than a call's
reply (docs/performance.md#background-work-in-slices)."""

Calls = Sequence[tuple[str, tuple[Any, ...]]]
"""Each call's key (the slot it touches) and its command."""


async def in_slices(nodes: NodeClients, calls: Calls) -> list[Any]:
    """The replies of ``calls``, in order; an error reply (a refusal before the call ran
    included: ``NOTHING_RAN``) is its exception object, for the caller to judge. A node whose
    connection is lost has that error (``CONNECTION_ERRORS``) as the reply of each of its calls
    not answered, and the other nodes go on."""
    replies: list[Any] = [None] * len(calls)
    by_node: dict[int, tuple[redis.asyncio.Redis, list[int]]] = {}
    for i, (key, _) in enumerate(calls):
        try:
            client = nodes.for_key(key)
        except NOTHING_RAN as exc:  # no primary serves the slot now
            replies[i] = exc
            continue
        by_node.setdefault(id(client), (client, []))[1].append(i)

    async def on_node(client: 'redis.asyncio.Redis', mine: list[int]) -> None:
        for start in range(0, len(mine), CALLS_PER_PIPELINE):
            chunk = mine[start : start + CALLS_PER_PIPELINE]
            try:
                answered = await packed.pipeline(
                    client, [calls[i][1] for i in chunk], raise_on_error=False
                )
            except CONNECTION_ERRORS as exc:
                for i in mine[start:]:
                    replies[i] = exc
                return
            for i, reply in zip(chunk, answered, strict=True):
                replies[i] = reply

    await asyncio.gather(*(on_node(client, mine) for client, mine in by_node.values()))
    return replies
