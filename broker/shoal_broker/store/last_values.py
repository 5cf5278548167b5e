"""
The last-value queues (docs/architecture.md#last-value-queues): which queue addresses keep only
the newest unread message per key, and in which application property the key is. The broker-wide
patterns (SHOAL_LAST_VALUE_ADDRESSES) and what declared Queues set (``lastValue{}``), read by the
producers' side (``Messages.last_value_key``: whether to read a message's key) and where a
message is stored (publish_last.lua, its op built here for ``cycles.py``).
"""

from collections.abc import Callable, Mapping
from typing import Any

from shoal_broker.metrics.registry import duplicates_dropped, values_replaced
from shoal_broker.routing.storage import QUEUE_GROUP, OutgoingMessage
from shoal_broker.settings import LastValueSettings
from shoal_broker.store import keys
from shoal_broker.store.duplicates import DuplicateWindows
from shoal_broker.store.lane import Encoded, encode
from shoal_broker.store.ops import PARTS_PER_MESSAGE, Op

MAX_MATCHED = 10_000
"""Addresses whose match against the patterns is remembered; past it the memory starts over."""

LAST_PARTS_PER_MESSAGE = PARTS_PER_MESSAGE + 1
"""A message of a last-value queue: its ``PARTS_PER_MESSAGE``, then its duplicate id and its key
value, encoded together."""


class LastValues:
    def __init__(self, settings: LastValueSettings | None = None) -> None:
        self.per_address: dict[str, str | None] = {}
        """Declared queues' own (``lastValue``), over the patterns: None turns it off. Updated in
        place: ``of`` may be its ``get``."""
        self._matched: dict[str, str | None] = {}
        self.of: Callable[[str], str | None] = self.per_address.get
        """The key property of a last-value queue at an address; None when it is not one.
        Without patterns the declared queues' ``dict.get``: no Python frame per message."""
        self.settings = LastValueSettings()
        self.configure(settings or self.settings)

    def configure(self, settings: LastValueSettings) -> None:
        self.settings = settings
        self._matched.clear()
        self.of = self._matched_of if settings.addresses else self.per_address.get

    def set_per_address(self, declared: Mapping[str, str | None]) -> None:
        if declared != self.per_address:
            self.per_address.clear()
            self.per_address.update(declared)

    def _matched_of(self, address: str) -> str | None:
        if address in self.per_address:
            return self.per_address[address]
        if address not in self._matched:
            if len(self._matched) >= MAX_MATCHED:
                self._matched.clear()
            matched = self.settings.matches(address)
            self._matched[address] = self.settings.key_property if matched else None
        return self._matched[address]


def sextuples(members: list[Op]) -> Encoded:
    """The merged publish ops of a last-value queue as publish_last.lua's sextuples (the four of
    publish.lua, the duplicate id, the key value), in order."""
    parts = [part for op in members for part in op.batch_args]
    return Encoded(parts, len(parts) // LAST_PARTS_PER_MESSAGE * 6)


def publish_last_command(
    source: str, key: tuple[Any, ...], members: list[Op], replica_id: str,
    backlog: tuple[int, str] | None,
) -> tuple[Any, ...]:  # fmt: skip
    """The one EVAL of a cycle's ``('last', address, band, kind, count, seconds, group)`` ops;
    count 0: no duplicate detection. By source, as the other publishes (``cycles.py``)."""
    _, address, band, kind, count, seconds, group = key
    k = keys.AddressKeys.of(address)
    script_keys = (k.streams[band], k.groups, k.watchers, k.duplicates, *k.streams,
                   k.last_values, k.last_value_order, k.levels)  # fmt: skip
    return ('EVAL', source, len(script_keys), *script_keys, kind, k.notify, replica_id, count,
            seconds * 1000, *(backlog or (0, '')), group, band, sextuples(members))  # fmt: skip


def last_op(
    address: str, kind: str, message: OutgoingMessage, duplicates: DuplicateWindows,
    encoded: tuple[bytes, ...],
) -> tuple[tuple[Any, ...], tuple[bytes, ...]]:  # fmt: skip
    """The batch key and the encoded parts of a message to a last-value queue: every message of
    the queue takes this op (b'' for no duplicate id or no key), so none overtakes another."""
    window = duplicates.of(address)
    count, seconds = (window.count, window.seconds) if window is not None else (0, 0)
    key = ('last', address, message.band, kind, count, seconds, QUEUE_GROUP)
    return key, (*encoded, encode(message.duplicate_id or b'', message.last_value or b''))


def count_checked(address: str, reply: list[Any]) -> None:
    """Count a checked publish's outcome: publish_unique.lua's {added, duplicates dropped}, or
    publish_last.lua's, with the values replaced after them."""
    if len(reply) == 2 or int(reply[1]):  # no duplicate series for a queue not detecting
        duplicates_dropped(address, int(reply[1]))
    if len(reply) > 2:
        values_replaced(address, int(reply[2]))
