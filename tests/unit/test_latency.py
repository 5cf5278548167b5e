"""Accepted deliveries counted into the latency histogram and the records' sketch in C
(metrics/_latency.c): the same figures, float for float, as the Python loop it replaced, which is
kept here as the reference."""

import bisect
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal_broker.metrics import _latency, records
from shoal_broker.metrics.hot import DELIVERY_LATENCY_BUCKETS
from shoal_broker.routing.storage import Entry


def reference(ages: list[float], histogram: list[float], sketch: dict[int, int]) -> None:
    """Counters.accepted_all's loop as it was in Python."""
    for seconds in ages:
        if seconds < 0:
            seconds = 0.0
        histogram[bisect.bisect_left(DELIVERY_LATENCY_BUCKETS, seconds)] += 1
        histogram[-1] += seconds
        index = (
            math.ceil(math.log(seconds) * records.SKETCH_MULTIPLIER)
            if seconds > records.SKETCH_MIN_SECONDS
            else records.SKETCH_MIN_INDEX
        )
        sketch[index] = sketch.get(index, 0) + 1


def entry(entry_id: str) -> Entry:
    return Entry(entry_id, 5, b'h', b'r', 0, 0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2**45), st.integers(0, 99)), max_size=40),
    st.floats(0, 2**36, allow_nan=False),
    st.integers(1, 3),
)
def test_the_c_counts_what_the_python_loop_counted(
    ids: list[tuple[int, int]], now: float, calls: int
) -> None:
    entries = [entry(f'{ms}-{seq}') for ms, seq in ids]
    ages = [now - int(e.id.partition('-')[0] or 0) / 1000 for e in entries]
    width = len(DELIVERY_LATENCY_BUCKETS) + 2
    expected, made = [0.0] * width, [0.0] * width
    expected_sketch: dict[int, int] = {}
    made_sketch: dict[int, int] = {}
    for _ in range(calls):  # counts add up across calls, sums in the same order
        reference(ages, expected, expected_sketch)
        _latency.record(entries, now, made, made_sketch)
    assert made == expected
    assert made_sketch == expected_sketch


@pytest.mark.parametrize(
    ('entries', 'error'),
    [
        ([entry('17x-0')], ValueError),
        ([entry('1' * 20 + '-0')], ValueError),
        ([entry('ünï-0')], ValueError),
        (['1-0'], TypeError),
    ],
)
def test_an_entry_that_is_not_one_is_refused(entries: list[Entry], error: type[Exception]) -> None:
    with pytest.raises(error):
        _latency.record(entries, 1.0, [0.0] * (len(DELIVERY_LATENCY_BUCKETS) + 2), {})


def test_a_histogram_of_another_width_is_refused() -> None:
    with pytest.raises(ValueError, match='histogram'):
        _latency.record([entry('1-0')], 1.0, [0.0] * 3, {})
