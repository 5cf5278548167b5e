"""
A short, bounded pass of every fuzz target (``make fuzz`` runs 100 000 inputs each), and the
inputs fuzzing found that once broke a decoder, kept as regression tests.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from shoal_broker.amqp import codec, sasl
from shoal_broker.security.authenticator import Authenticator, AuthPolicy

FUZZ = Path(__file__).resolve().parents[2] / 'fuzz'
TARGETS = ['sasl', 'sections', 'selector', 'frames', 'replies']

BAD_CHAR_MESSAGE = (
    b'\x00\x53\x73\xc0\x08\x03\x40\x40\x73\x7f\xff\xff\xff'  # properties: to = char 0x7fffffff
    + b'\x00\x53\x77\xa1\x01x'  # amqp-value 'x'
)


@pytest.mark.slow
@pytest.mark.parametrize('target', TARGETS)
def test_a_short_fuzz_run_finds_nothing(target: str, tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(FUZZ / 'run.py'), target, '-runs=5000', '-max_total_time=10',
         '-timeout=5', f'-artifact_prefix={tmp_path}/', str(tmp_path / 'corpus')],
        capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert 'Done' in run.stderr
    assert not list(tmp_path.glob('crash-*'))


def test_a_char_outside_unicode_is_a_decode_error() -> None:
    """Found by the ``sections`` target: ``chr()``'s ValueError escaped the decoder, so a
    message with such a char in its properties failed its connection instead of being rejected."""
    with pytest.raises(codec.DecodeError, match='not a Unicode code point'):
        codec.parse(BAD_CHAR_MESSAGE)


def test_an_unhashable_sasl_descriptor_fails_the_handshake_cleanly() -> None:
    """Found by the ``sasl`` target: a described value as descriptor (here a list) made the
    frame lookup raise TypeError out of ``SaslHandshake.receive``."""
    handshake = sasl.SaslHandshake(
        Authenticator(AuthPolicy(allow_anonymous=True, users=None)), None
    )
    handshake.receive(sasl.SASL_HEADER)
    body = b'\x00\x00\x45\x45'  # descriptor: a described empty list; value: empty list
    step = handshake.receive(sasl.frame(body))
    assert handshake.state is sasl.State.FAILED
    assert step.output  # the sasl-outcome the peer reads before the close
