"""
The duplicate detection of addresses (docs/redis-modes.md#duplicate-detection): the broker-wide
default (SHOAL_DUPLICATE_DETECTION and its window) and what declared queues and subscriptions set
for their addresses, read by the producers' side (``Messages.duplicate_window``: whether to read
a message's id) and where a message is stored (the publish script chosen in ``cycles.py``).
"""

from collections.abc import Mapping

from shoal_broker.routing.storage import DuplicateWindow
from shoal_broker.settings import DuplicateSettings


def window_of(settings: DuplicateSettings) -> DuplicateWindow | None:
    """The broker-wide window; ValueError for a window that would remember nothing."""
    if not settings.enabled:
        return None
    if settings.window < 1 or settings.window_seconds < 1:
        raise ValueError('the duplicate window needs a count and seconds of at least 1')
    return DuplicateWindow(settings.window, settings.window_seconds, settings.id_property)


class DuplicateWindows:
    def __init__(self) -> None:
        self.everywhere: DuplicateWindow | None = None
        """Every address's window; None = detection off (SHOAL_DUPLICATE_DETECTION)."""
        self.per_address: dict[str, DuplicateWindow | None] = {}
        """Declared queues' and subscriptions' own (``duplicateDetection``), over ``everywhere``:
        None turns detection off for that address."""

    def set_per_address(self, windows: Mapping[str, DuplicateWindow | None]) -> None:
        self.per_address = dict(windows)

    def of(self, address: str) -> DuplicateWindow | None:
        return self.per_address.get(address, self.everywhere)
