"""The pause before a failed store call is tried again (``errors.next_retry_pause``), which
every retry of a fetch, recovery, release or line leave follows."""

from shoal_broker.errors import next_retry_pause


def test_a_failed_store_call_is_tried_again_after_a_pause_that_doubles_up_to_a_bound() -> None:
    pauses = [0.0]
    for _ in range(6):
        pauses.append(next_retry_pause(pauses[-1]))
    assert pauses[1:] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert next_retry_pause(0.3, longest=0.5) == 0.5
