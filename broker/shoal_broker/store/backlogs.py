"""
The backlog limits of addresses (docs/security.md): set by the upkeep (``Upkeep.limit_backlog``,
``Upkeep.limit_address_backlogs``), read where a message is stored (the publish script chosen in
``cycles.py``, whether ``Messages.claim_then`` may take one, the refusal's text).
"""

from collections.abc import Mapping

Backlog = tuple[int, str]
"""(limit, overflow policy)."""


class BacklogLimits:
    def __init__(self) -> None:
        self.everywhere: Backlog | None = None
        """Every address's limit; None = unlimited (SHOAL_MAX_BACKLOG_PER_ADDRESS)."""
        self.per_address: dict[str, Backlog] = {}
        """Declared queues' own limits (``retention.maxMessages``), over ``everywhere``."""

    def set_everywhere(self, limit: int, overflow: str) -> None:
        self.everywhere = (limit, overflow) if limit > 0 else None

    def set_per_address(self, limits: Mapping[str, Backlog]) -> None:
        self.per_address = dict(limits)

    def of(self, address: str) -> Backlog | None:
        return self.per_address.get(address, self.everywhere)

    def limit(self, address: str) -> int:
        """The address's limit in entries; 0 when it has none."""
        backlog = self.of(address)
        return backlog[0] if backlog is not None else 0
