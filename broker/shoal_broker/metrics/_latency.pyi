"""Types of ``_latency.c``: accepted deliveries counted into a latency histogram and sketch."""

from shoal_broker.routing.storage import Entry

def configure(
    bounds: tuple[float, ...], multiplier: float, min_seconds: float, min_index: int, /
) -> None:
    """The histogram's bounds (ascending) and the sketch's constants (``records.SKETCH_*``)."""

def record(entries: list[Entry], now: float, histogram: list[float], sketch: dict[int, int], /
           ) -> None:  # fmt: skip
    """Each entry's seconds from its enqueue (its id's time) to ``now``, 0 if the clock stepped
    back, counted into ``histogram`` (its bucket by bisection, then the sum of seconds last) and
    ``sketch`` (bucket index -> count)."""
