"""Types of ``_entry.c``: ``Entry`` as a type the garbage collector does not track."""

class Entry:
    """A stored message handed to one replica for delivery to one subscription."""

    id: str
    """Stream entry id, unique within its band."""
    band: int
    """The band (stream) the entry is in: 9 - priority."""
    header: bytes
    """The header section as stored."""
    rest: bytes
    """The message's other sections as stored."""
    expiry_ms: int
    """Absolute expiry, ms since the epoch; 0 means never."""
    delivery_count: int
    """Earlier delivery attempts that ended in a failure (AMQP header delivery-count)."""
    origin: str
    """Container-id of the publishing connection (no-local subscribers skip their own)."""
    group: str
    """The message group (properties.group-id); '': ungrouped."""

    __hash__: None  # type: ignore[assignment]

    def __init__(
        self,
        id: str,
        band: int,
        header: bytes,
        rest: bytes,
        expiry_ms: int,
        delivery_count: int,
        origin: str = '',
        group: str = '',
    ) -> None: ...
    @property
    def key(self) -> tuple[int, str]: ...
