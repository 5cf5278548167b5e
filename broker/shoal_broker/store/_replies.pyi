"""Types of ``_replies.c``: the store lane's replies read in C."""

from typing import Final

from shoal_broker.routing.storage import Entry

SHORT: Final[object]
"""What ``entries`` answers for a reply that goes on past the data it was given."""

class Scanner:
    """Where each reply of a Redis connection ends, read as the bytes come."""

    def __init__(self, error: type[Exception], /) -> None: ...
    def scan(self, data: bytes | bytearray, start: int, end: int, /) -> int:
        """The offset past the reply's end if it ends in ``data[start:end]``, else -1 (the place
        is kept for the next call); a stream that is not Redis's replies raises ``error``."""
    @property
    def midway(self) -> bool:
        """Part of a reply has been passed over."""

def entries(
    data: bytes | bytearray, start: int, end: int, band: int, /
) -> tuple[list[Entry], int] | object | None:
    """The entries of the plain XREADGROUP reply at ``data[start:end]`` and the offset past it;
    ``SHORT`` if it goes on past ``end``; None for a reply of another shape."""
