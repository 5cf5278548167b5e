"""The id duplicate detection compares (amqp/duplicate_ids.py), read from real encoded messages."""

import uuid
from typing import Any

import proton

from shoal_broker.amqp import codec
from shoal_broker.amqp.duplicate_ids import MAX_ID_BYTES, duplicate_id
from shoal_broker.routing.policies import EntityPolicy, declared_duplicates
from shoal_broker.routing.storage import DuplicateWindow
from shoal_broker.settings import DuplicateSettings


def rest_of(message: proton.Message) -> bytes:
    return codec.parse(message.encode()).rest


def id_of(message_id: Any = None, prop: str = '', **properties: Any) -> bytes | None:
    message = proton.Message(body='x', id=message_id, properties=properties or None)
    return duplicate_id(rest_of(message), prop)


def test_the_message_id_with_its_type() -> None:
    same = uuid.uuid4()
    assert id_of(f'ID:{same}:1:1:1-1') == f'sID:{same}:1:1:1-1'.encode()
    assert id_of(same) != id_of(str(same))
    assert id_of(7) != id_of('7')
    assert id_of(b'raw') == b'braw'
    assert id_of() is None


def test_a_str8_and_a_str32_are_one_id() -> None:
    text = b'ID:one'
    # message annotations (none), then properties [message-id] as str8 and as str32
    str8 = b'\x00\x53\x73\xc0' + bytes([2 + len(text), 1]) + b'\xa1' + bytes([len(text)]) + text
    wide = b'\xb1' + len(text).to_bytes(4, 'big') + text
    str32 = b'\x00\x53\x73\xc0' + bytes([1 + len(wide), 1]) + wide
    assert duplicate_id(str8, '') == duplicate_id(str32, '') == b'sID:one'


def test_an_application_property() -> None:
    assert id_of('m', '_AMQ_DUPL_ID', _AMQ_DUPL_ID='order-7') == b'sorder-7'
    assert id_of('m', '_AMQ_DUPL_ID', other='order-7') is None
    assert id_of('m', '_AMQ_DUPL_ID') is None
    assert id_of('m', 'n', n=12) == b'n12'


def test_a_long_id_is_kept_as_its_digest() -> None:
    long_one, other = 'x' * 5000, 'x' * 4999 + 'y'
    assert len(id_of(long_one) or b'') <= MAX_ID_BYTES
    assert id_of(long_one) != id_of(other)


def test_declared_windows_per_address() -> None:
    defaults = DuplicateSettings(window=100, window_seconds=60)
    policies = {
        'queue:orders': EntityPolicy(duplicate_detection=True, duplicate_window=5),
        'queue:plain': EntityPolicy(duplicate_detection=False),
        'queue:unset': EntityPolicy(max_messages=3),
        'subscription:a': EntityPolicy(duplicate_detection=True, topic='prices'),
        'subscription:b': EntityPolicy(
            duplicate_detection=True, duplicate_window_seconds=600, topic='prices'
        ),
    }
    assert declared_duplicates(policies, defaults) == {
        'orders': DuplicateWindow(5, 60, ''),
        'plain': None,
        'prices': DuplicateWindow(100, 600, ''),
    }
    policy = EntityPolicy(duplicate_detection=True, duplicate_id_property='_AMQ_DUPL_ID')
    assert EntityPolicy.from_json(policy.to_json()) == policy
