"""The broker's own sampling shortcut (``Tracing.wanted``) decides as the SDK's sampler does."""

import random
from collections.abc import Iterator

import pytest

from shoal_broker.settings import TracingSettings
from shoal_broker.tracing import Tracing


@pytest.fixture
def tracing() -> Iterator[Tracing]:
    t = Tracing(TracingSettings(enabled=True, sample_ratio=0.25), 'unit')
    yield t
    t.shutdown()  # no span is ended here, so nothing is exported


def test_the_shortcut_agrees_with_the_sdk_on_every_trace_id(tracing: Tracing) -> None:
    rng = random.Random(36)
    contexts = [
        f'00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-01' for _ in range(2000)
    ]
    kept = [tp for tp in contexts if tracing.wanted(tp)]
    assert 400 < len(kept) < 600  # about a quarter
    for tp in contexts:
        recorded = tracing.publish_span({'traceparent': tp}, 'a', {}) is not None
        assert tracing.wanted(tp) == recorded, tp


@pytest.mark.parametrize('traceparent', [
    '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00',  # the producer did not sample it
    '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331',
    '00-0af7651916cd43dd8448eb2zzzzzzzzz-b7ad6b7169203331-01',
    '',
])  # fmt: skip
def test_an_unsampled_or_malformed_context_is_not_wanted(
    tracing: Tracing, traceparent: str
) -> None:
    assert not tracing.wanted(traceparent)
