"""``Entry``, the C type every delivery is (routing/_entry.c): the garbage collector never
tracks it, and it behaves as the dataclass it replaces did; no field takes a value that could
refer back to anything, so an Entry can never be part of a cycle the collector would have to
find."""

import copy
import gc
import pickle

import pytest

from shoal_broker.routing.storage import Entry


def entry() -> Entry:
    return Entry('1700000000000-0', 5, b'\x00Sp', b'\x00Sw\xa1\x02hi', 0, 0, 'c1', 'g1')


def test_an_entry_is_not_tracked_by_the_garbage_collector() -> None:
    assert not gc.is_tracked(entry())
    before = len(gc.get_objects(0))
    held = [entry() for _ in range(1000)]
    assert len(gc.get_objects(0)) - before < 10  # the list and what the loop made, no entries
    assert not any(gc.is_tracked(e) for e in held)


def test_fields_are_given_by_position_or_by_name_and_origin_and_group_default_to_empty() -> None:
    e = Entry('2-0', 3, b'h', b'r', 17, 2)
    assert (e.id, e.band, e.header, e.rest, e.expiry_ms, e.delivery_count) == (
        '2-0', 3, b'h', b'r', 17, 2,
    )  # fmt: skip
    assert (e.origin, e.group) == ('', '')
    named = Entry(id='2-0', band=3, header=b'h', rest=b'r', expiry_ms=17, delivery_count=2,
                  group='g')  # fmt: skip
    assert (named.origin, named.group) == ('', 'g')
    assert named.key == (3, '2-0')


def test_construction_errors_name_the_argument() -> None:
    with pytest.raises(TypeError, match="missing required argument 'header'"):
        Entry('1-0', 5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        Entry('1-0', 5, b'', b'', 0, 0, colour='red')  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="multiple values for argument 'band'"):
        Entry('1-0', 5, b'', b'', 0, 0, band=4)  # type: ignore[misc]
    with pytest.raises(TypeError, match=r'at most 8 arguments'):
        Entry('1-0', 5, b'', b'', 0, 0, '', '', '')  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r'Entry\.band must be int, not str'):
        Entry('1-0', '5', b'', b'', 0, 0)  # type: ignore[arg-type]


def test_fields_are_writable_with_their_own_types_only() -> None:
    e = entry()
    e.rest = b'new'
    e.delivery_count = 3
    assert (e.rest, e.delivery_count) == (b'new', 3)
    e.rest = memoryview(b'view')  # type: ignore[assignment]
    assert e.rest == b'view'
    assert type(e.rest) is bytes  # copied to bytes: nothing is referenced
    for field, value in [('rest', 'text'), ('id', 7), ('band', 1.5), ('group', [e]), ('origin', e)]:
        with pytest.raises(TypeError, match=rf'Entry\.{field} must be'):
            setattr(e, field, value)
    with pytest.raises(AttributeError):
        e.colour = 'red'  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        del e.rest


def test_a_subclass_of_a_field_type_is_stored_as_the_type_itself() -> None:
    class Text(str):
        pass

    class Number(int):
        pass

    e = Entry(Text('1-0'), Number(5), bytearray(b'h'), b'r', True, 0)  # type: ignore[arg-type]
    assert [type(e.id), type(e.band), type(e.header), type(e.expiry_ms)] == [str, int, bytes, int]
    assert e.expiry_ms == 1


def test_equality_is_by_fields_and_an_entry_is_not_hashable() -> None:
    assert entry() == entry()
    other = entry()
    other.delivery_count = 1
    assert other != entry()
    assert entry() != ('1700000000000-0', 5)
    with pytest.raises(TypeError):
        hash(entry())


def test_an_entry_copies_pickles_and_shows_its_fields() -> None:
    e = entry()
    copied = copy.copy(e)
    assert copied == e
    assert copied is not e
    assert pickle.loads(pickle.dumps(e)) == e
    assert repr(e) == (
        "Entry(id='1700000000000-0', band=5, header=b'\\x00Sp', rest=b'\\x00Sw\\xa1\\x02hi', "
        "expiry_ms=0, delivery_count=0, origin='c1', group='g1')"
    )


def test_the_type_cannot_be_subclassed() -> None:
    with pytest.raises(TypeError):
        type('Sub', (Entry,), {})
