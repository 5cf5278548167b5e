"""
A script sent by source once per pipeline, not once per command.

Publishing scripts go to Redis by source (``EVAL``, calls.py): a script Redis lost, on a primary
promoted by a failover that never loaded it for example, must not fail one publish while a later
one of the same producer goes through, and a lost wake-up (``notify.lua``) must not lose a
consumer's turn. Batching is per address, so a cycle over many addresses carries one such command
per address: at 1 000 queues each message paid for its script's 5 KiB, ~9 µs of Redis (reading
it, hashing it) and ~3 µs of the broker (packing it), and a cycle of 2 000 publishes was a 30 MB
pipeline (docs/performance.md#scripts-once-a-pipeline).

So a pipeline that carries a script by source more than once carries it once, as a
``SCRIPT LOAD`` at its head, and those commands by hash after it. Redis runs one connection's
commands in the order they came, so every command of the pipeline finds the script its head
loaded: what a lost script could do to a producer's order is what it could do before. A
``SCRIPT LOAD`` has no key (no redirection on Redis Cluster, where each node's pipeline gets its
own head) and is not refused for memory. Only a ``SCRIPT FLUSH`` by hand that lands between the
head and a command of the same pipeline could fail that command ``NOSCRIPT`` now; it is then sent
again, as before, after the scripts are loaded.
"""

import hashlib
from collections.abc import Sequence
from typing import Any

from shoal_broker.store import scripts

BY_SOURCE = ('publish', 'publish_limited', 'publish_unique', 'publish_last', 'publish_claim',
             'notify')  # fmt: skip
"""The scripts the store sends by source (calls.py). A fetch goes by hash, its read in bulk too
(messages.py)."""

_HASHES: dict[str, str] = {
    scripts.source(name): hashlib.sha1(scripts.source(name).encode()).hexdigest()
    for name in BY_SOURCE
}
"""Source -> SHA1, as Redis names a script."""


def with_heads(commands: Sequence[tuple[Any, ...]]) -> tuple[Sequence[tuple[Any, ...]], int]:
    """``commands`` with each script that goes by source more than once loaded at the head and
    sent by hash, and how many heads that put before them (0: ``commands`` as they were)."""
    seen: dict[str, int] = {}
    for command in commands:
        if command[0] == 'EVAL' and command[1] in _HASHES:
            seen[command[1]] = seen.get(command[1], 0) + 1
    repeated = [source for source, count in seen.items() if count > 1]
    if not repeated:
        return commands, 0
    hashes = {source: _HASHES[source] for source in repeated}
    rewritten: list[tuple[Any, ...]] = [('SCRIPT', 'LOAD', source) for source in repeated]
    for command in commands:
        if command[0] == 'EVAL' and command[1] in hashes:
            rewritten.append(('EVALSHA', hashes[command[1]], *command[2:]))
        else:
            rewritten.append(command)
    return rewritten, len(repeated)
