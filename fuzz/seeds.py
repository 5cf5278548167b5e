"""
Starting inputs per fuzz target: well-formed examples the fuzzer mutates from (written fresh
into the corpus directory on every run, so nothing binary is kept in the repository).
"""

from pathlib import Path

import scramp
from harnesses import FUZZ_PASSWORD
from proton import Message, symbol
from saslwire import frame

from shoal_broker.amqp import sasl


def sasl_seeds() -> list[bytes]:
    header = sasl.SASL_HEADER
    scram = scramp.ScramClient(['SCRAM-SHA-256'], 'fuzz', FUZZ_PASSWORD)
    return [
        header + frame(0x41, 'PLAIN', b'\0fuzz\0' + FUZZ_PASSWORD.encode(), None),
        header + frame(0x41, 'PLAIN', b'\0fuzz\0wrong', None),
        header + frame(0x41, 'ANONYMOUS', b'', 'host'),
        b'E' + header[1:] + frame(0x41, 'EXTERNAL', b'', None),
        header
        + frame(0x41, 'SCRAM-SHA-256', scram.get_client_first().encode(), None)
        + frame(0x43, b'c=biws,r=abc,p=AAAA'),
        header + frame(0x41, 'SCRAM-SHA-512', b'n,,n=nobody,r=xyz', None),
        sasl.AMQP_HEADER + b'\x00\x00\x00\x08\x02\x00\x00\x00',
    ]


def section_seeds() -> list[bytes]:
    messages = [
        Message(body='text', durable=True, priority=7, ttl=5, properties={'a': 1, 'b': 'x'}),
        Message(
            body=b'\x00\x01',
            id='ID:1',
            correlation_id=5,
            subject='s',
            address='q',
            annotations={symbol('x-opt-jms-dest'): 0, symbol('x-opt-delivery-time'): 1},
        ),
        Message(body={'k': [1, 2.5, None, True]}, content_type='application/json'),
        Message(body=[1, 2, 3], properties={'big': 2**40, 'neg': -3, 'f': 1.5}),
    ]
    return [bytes(m.encode()) for m in messages]


def selector_seeds() -> list[bytes]:
    texts = [
        "a = 1 AND b > 2.5 OR c LIKE 'x%' ESCAPE '!'",
        'JMSPriority BETWEEN 3 AND 7 AND NOT d IS NULL',
        "c IN ('x', 'y', 'z') AND (a + 2) * 3 / 4 - 1 <> 0",
        "JMSType = 't' OR JMSMessageID NOT LIKE 'ID:_%'",
        'TRUE',
    ]
    return [t.encode() for t in texts]


def frame_seeds() -> list[bytes]:
    """Recipes for ``harnesses.mutated_frames``: each base stream unchanged, and truncated."""
    return [bytes([0]), bytes([1]), bytes([0x41, 0x80]), bytes([0x81]) + b'\x00' * 3]


def reply_seeds() -> list[bytes]:
    """Byte 0 (which replies read entries, where the stream splits), then replies as Redis 7
    sends them: a plain read of new entries in RESP3 and RESP2, nulls, errors, nested
    aggregates."""

    def bulk(value: bytes) -> bytes:
        return b'$%d\r\n%s\r\n' % (len(value), value)

    entry = (
        b'*2\r\n'
        + bulk(b'1700000000000-0')
        + b'*8\r\n'
        + b''.join(
            bulk(v)
            for v in (b'h', b'\x00Sp', b'r', b'\x00Sw\xa1\x02hi', b'x', b'17', b'c', b'conn')
        )
    )
    entries = bulk(b'shoal:{a:q}:p:5') + b'*2\r\n' + entry + entry
    return [
        b'\x01%1\r\n' + entries + b'+OK\r\n',
        b'\x03*1\r\n*2\r\n' + entries + b'_\r\n',
        b'\x05_\r\n:1\r\n*-1\r\n',
        b'\x00-NOGROUP No such key\r\n*3\r\n$-1\r\n%1\r\n+k\r\n~1\r\n:7\r\n#t\r\n',
        b'\x02>2\r\n+a\r\n,1.5\r\n|1\r\n+a\r\n+b\r\n(12345678901234567890\r\n',
    ]


SEEDS = {
    'sasl': sasl_seeds,
    'sections': section_seeds,
    'selector': selector_seeds,
    'frames': frame_seeds,
    'replies': reply_seeds,
}


def write(name: str, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(SEEDS[name]()):
        (directory / f'seed-{i}').write_bytes(seed)
