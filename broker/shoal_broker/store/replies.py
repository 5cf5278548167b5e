"""
Entries from Redis replies: fetch.lua's and publish_claim.lua's septuples, and a plain
XREADGROUP of the priority-4 band (``Messages._fetch_op``); and whether ``WAIT 0 0`` with ``ROLE``
says a replica is there (``Messages.replica_ready``); a page of browse.lua's replies, one per
band (``Messages.browse``).
"""

from typing import Any

from shoal_broker.routing.storage import NORMAL_BAND, BrowseCursor, Entry
from shoal_broker.store.calls import as_text


def entries_of(flat: list[Any], start: int = 0) -> list[Entry]:
    """Entries from fetch.lua's octuples (from ``start`` in its reply)."""
    # positional (id, band, header, rest, expiry_ms, delivery_count, origin, group): keyword
    # construction costs ~2 µs per entry
    return [
        Entry(
            flat[i + 1].decode(),
            int(flat[i]),
            flat[i + 2],
            flat[i + 3],
            int(flat[i + 4]),
            int(flat[i + 5]),
            flat[i + 6].decode(),
            flat[i + 7].decode(),
        )
        for i in range(start, len(flat), 8)
    ]


def new_entries(reply: Any) -> list[Entry]:
    """Entries from a plain XREADGROUP of the priority-4 band: fields in append_entries.lua's order,
    header and rest first, then expiry, origin and message group when present. The reply is a
    map under RESP3 (the store's connections) and a list of (stream, entries) pairs under
    RESP2, or the entries themselves where the lane made them (``lane.READ_ENTRIES``)."""
    if not reply:
        return []
    if type(reply) is list and type(reply[0]) is Entry:
        return reply
    found: list[Entry] = []
    read = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
    append = found.append
    for raw_id, fields in read:
        expiry_ms, origin, group = 0, '', ''
        if len(fields) == 6 and fields[4] == b'c':  # the common shape: an origin, no expiry
            origin = fields[5].decode()
        else:
            for i in range(4, len(fields), 2):
                if fields[i] == b'x':
                    expiry_ms = int(fields[i + 1])
                elif fields[i] == b'c':
                    origin = fields[i + 1].decode()
                elif fields[i] == b'g':
                    group = fields[i + 1].decode()
        append(Entry(raw_id.decode(), NORMAL_BAND, fields[1], fields[3], expiry_ms, 0, origin,
                     group))  # fmt: skip
    return found


def replica_is_ready(replies: list[Any]) -> bool:
    """From ``WAIT 0 0`` and ``ROLE``: a replica has all this connection wrote, or one is
    connected and streaming (its acknowledged offset is not behind the primary's by more than
    what it has yet to read: the next write's ``WAIT`` confirms it)."""
    if isinstance(replies[1], int) and replies[1] >= 1:
        return True
    role = replies[2]
    if not isinstance(role, list) or len(role) < 3 or as_text(role[0]) != 'master':
        return False
    return any(int(replica[2]) > 0 for replica in role[2])


def browse_page(
    cursor: BrowseCursor, replies: list[Any], count: int
) -> tuple[list[Entry], BrowseCursor]:
    """At most ``count`` entries from browse.lua's replies for ``cursor``'s bands (read
    independently, highest first), and the cursor after the last one shown."""
    shown: list[Entry] = []
    positions = []
    for (band, position), reply in zip(cursor.positions, replies, strict=True):
        found = [
            Entry(as_text(reply[i]), band, reply[i + 1], reply[i + 2], int(reply[i + 3]), 0)
            for i in range(1, len(reply), 4)
        ]
        room = count - len(shown)
        if len(found) <= room:
            positions.append((band, as_text(reply[0])))
            shown += found
        else:
            shown += found[:room]
            positions.append((band, found[room - 1].id if room else position))
    return shown, BrowseCursor(tuple(positions))
