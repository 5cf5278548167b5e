"""The dispatch rules of routing/dispatch.py, on plain data: no proton, no Redis, no loop."""

import pytest

from shoal_broker.routing import dispatch
from shoal_broker.routing.dispatch import (
    MAX_HELD,
    MAX_HELD_BYTES,
    NONE_SERVED,
    Take,
    Unwanted,
    due_parked,
    enqueued_before,
    expired,
    next_with_room,
)
from shoal_broker.routing.storage import QUEUE_GROUP, Entry


@pytest.mark.parametrize(
    ('last', 'rooms', 'expected'),
    [
        (0, [5], 0),  # a lone consumer with credit, whatever came before
        (0, [0], -1),
        (0, [3, 3, 3], 1),  # the one after the last served
        (2, [3, 3, 3], 0),  # wrapping around
        (0, [3, 0, 3], 2),  # skipping one without room
        (1, [0, 0, 0], -1),
        (1, [0, 4, 0], 1),  # the last served again, when it alone has room
        (0, [], -1),
    ],
)
def test_round_robin_picks_the_next_consumer_with_room(
    last: int, rooms: list[int], expected: int
) -> None:
    assert next_with_room(last, rooms) == expected


def test_round_robin_deals_evenly_from_the_oldest() -> None:
    last, served = NONE_SERVED, []
    for _ in range(6):
        last = next_with_room(last, [10, 10, 10])
        served.append(last)
    assert served == [0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize(
    ('rooms', 'expected'),
    [
        ([1, 1], 0),  # two consumers with credit: the first message goes to the first
        ([0, 1], 1),  # unless it has no room
        ([0, 0], -1),
        ([], -1),
    ],
)
def test_nobody_served_yet_starts_at_the_oldest(rooms: list[int], expected: int) -> None:
    assert next_with_room(NONE_SERVED, rooms) == expected


class _Consumers(dispatch.Lane[str, str]):
    """A lane over named consumers in attach order, each with endless credit, that says who is
    served next, as ``LocalSubscription`` keeps its list."""

    def __init__(self) -> None:
        super().__init__(QUEUE_GROUP)
        self.consumers: list[str] = []

    def join(self, name: str, index: int | None = None) -> None:
        index = len(self.consumers) if index is None else index
        self.consumers.insert(index, name)
        self.joined(index)

    def leave(self, name: str) -> None:
        index = self.consumers.index(name)
        del self.consumers[index]
        self.left(index)

    def _with_credit(self) -> str | None:
        index = next_with_room(self._next, [1] * len(self.consumers))
        if index < 0:
            return None
        self._next = index
        return self.consumers[index]

    def deal(self, count: int) -> list[str | None]:
        return [self._with_credit() for _ in range(count)]


def test_the_turn_follows_the_consumers_as_they_come_and_go() -> None:
    lane = _Consumers()
    assert lane.deal(1) == [None]
    lane.join('a')
    lane.join('b')
    assert lane.deal(3) == ['a', 'b', 'a']  # the TCK's createSharedConsumer*: first to the first
    lane.leave('a')  # the one last served leaves: the one after it is next
    assert lane.deal(2) == ['b', 'b']
    lane.join('c')
    assert lane.deal(3) == ['c', 'b', 'c']
    lane.leave('c')
    lane.leave('b')
    lane.join('d')
    lane.join('e')
    assert lane.deal(2) == ['d', 'e']  # everyone left: the oldest of the new ones first


def test_a_consumer_leaving_before_the_last_served_keeps_the_turn_fair() -> None:
    lane = _Consumers()
    for name in 'abcd':
        lane.join(name)
    assert lane.deal(2) == ['a', 'b']
    lane.leave('a')
    assert lane.deal(3) == ['c', 'd', 'b']
    lane.leave('d')  # after the last served (b): nothing moves
    assert lane.deal(2) == ['c', 'b']


def test_an_older_attach_answered_late_takes_its_place_without_taking_the_turn() -> None:
    lane = _Consumers()
    lane.join('b')
    assert lane.deal(1) == ['b']
    lane.join('a', index=0)  # attached first, its store lookup answered second
    assert lane.consumers == ['a', 'b']
    assert lane.deal(3) == ['a', 'b', 'a']  # b was last served: a is next, then in order


@pytest.mark.parametrize(
    ('expiry_ms', 'entry_id', 'before_ms', 'expected'),
    [
        (0, '1000-0', 0, False),  # no TTL, no retention limit
        (1999, '1000-0', 0, True),  # its TTL ran out
        (2000, '1000-0', 0, True),  # exactly now counts as past
        (2001, '1000-0', 0, False),
        (0, '1000-0', 1001, True),  # enqueued before retention.maxAge allows
        (0, '1000-0', 1000, False),
        (0, '1000-5', 999, False),
    ],
)
def test_expiry_at_dispatch(expiry_ms: int, entry_id: str, before_ms: int, expected: bool) -> None:
    entry = Entry(entry_id, 0, b'', b'', expiry_ms, 0)
    assert expired(entry, 2000, before_ms) is expected


def test_retention_limit_is_counted_back_from_now() -> None:
    assert enqueued_before(10_000, 3_000) == 7_000
    assert enqueued_before(10_000, 0) == 0  # no limit


@pytest.mark.parametrize(
    ('has_consumers', 'consume', 'expected'),
    [
        (False, True, Unwanted.RELEASE),  # everyone left while the fetch was out
        (False, False, Unwanted.RELEASE),
        (True, True, Unwanted.CONSUME),  # a topic subscription's filter refuses it
        (True, False, Unwanted.PARK),  # a queue: someone else may want it
    ],
)
def test_an_entry_nobody_wants(has_consumers: bool, consume: bool, expected: Unwanted) -> None:
    assert dispatch.unwanted(has_consumers, consume) is expected


def test_only_topic_subscriptions_consume_what_filters_refuse() -> None:
    assert dispatch.filters_consume('sub-1')
    assert not dispatch.filters_consume(QUEUE_GROUP)


def test_parked_entries_return_when_due_in_order() -> None:
    parked = [(1.0, 'a'), (5.0, 'b'), (2.0, 'c')]
    assert due_parked(parked, 2.0, everything=False) == (['a', 'c'], [(5.0, 'b')])
    assert due_parked(parked, 0.0, everything=True) == (['a', 'b', 'c'], [])
    assert due_parked([], 9.0, everything=False) == ([], [])


PRESETTLED, SETTLING, FILTERED = (True, False), (False, False), (False, True)


@pytest.mark.parametrize(
    ('allowed', 'group', 'consumers', 'hands', 'ahead'),
    [
        (True, QUEUE_GROUP, [PRESETTLED, PRESETTLED], True, False),
        (True, QUEUE_GROUP, [SETTLING], False, True),
        (True, QUEUE_GROUP, [PRESETTLED, SETTLING], False, False),  # mixed: neither
        (True, QUEUE_GROUP, [SETTLING, FILTERED], False, False),  # a selector: neither
        (True, QUEUE_GROUP, [(True, True)], False, False),
        (True, QUEUE_GROUP, [], False, False),  # nobody to hand to
        (True, 'sub-1', [PRESETTLED], False, False),  # topic subscriptions never
        (False, QUEUE_GROUP, [PRESETTLED], False, False),  # turned off
        (False, QUEUE_GROUP, [SETTLING], False, False),
    ],
)
def test_which_queues_hand_over_or_send_ahead(
    allowed: bool, group: str, consumers: list[tuple[bool, bool]], hands: bool, ahead: bool
) -> None:
    assert dispatch.hands_over(allowed, group, consumers) is hands
    assert dispatch.sends_ahead(allowed, group, consumers) is ahead


class _Lane(dispatch.Lane[str, str]):
    """A lane whose next consumer with credit is always there."""

    def _with_credit(self) -> str:
        return 'consumer'


def _lane(**state: object) -> dispatch.Lane[str, str]:
    """A queue's lane that hands over and sends ahead, nothing stored unread, then ``state``
    (the Lane's attributes by name, without their leading underscore)."""
    lane = _Lane(QUEUE_GROUP)
    lane.hands_over = lane.sends_ahead = True
    lane._exhausted = True
    for name, value in state.items():
        attribute = name if hasattr(lane, name) else f'_{name}'
        assert hasattr(lane, attribute), name
        setattr(lane, attribute, value)
    return lane


def test_send_ahead_only_when_nothing_stored_is_unread_and_nothing_is_in_the_way() -> None:
    assert _lane().ahead() == 'consumer'
    assert _lane(claims=1).ahead() == 'consumer'  # a second claim while the first is out
    for blocker, value in [
        ('sends_ahead', False),
        ('shared', True),  # other replicas' consumers: the store decides who takes it
        ('exhausted', False),  # something stored may be unread: order first
        ('claims', 2),  # two claims at a time at most
        ('fetching', True),
        ('parked', [(1.0, Entry('1-0', 0, b'', b'', 0, 0))]),
        ('recovering', True),
    ]:
        assert _lane(**{blocker: value}).ahead() is None, blocker


def test_hand_over_goes_first_when_nothing_stored_is_unread() -> None:
    assert _lane().take_rule() is Take.FIRST
    assert _lane(held=['m'] * 3, held_bytes=3000).take_rule() is Take.HOLD  # behind held ones


def test_hand_over_waits_behind_a_fetch_in_flight() -> None:
    assert _lane(exhausted=False, fetching=True).take_rule() is Take.HOLD
    assert _lane(exhausted=False, fetching=True, recovering=True).take_rule() is Take.STORE
    assert _lane(exhausted=False).take_rule() is Take.STORE  # unread entries may be stored


@pytest.mark.parametrize(
    'state',
    [
        {'hands_over': False},
        {'shared': True},
        {'parked': [(1.0, Entry('1-0', 0, b'', b'', 0, 0))]},
        {'held': ['m'] * MAX_HELD},
        {'held_bytes': MAX_HELD_BYTES},
    ],
)
def test_hand_over_stores_what_it_may_not_hold(state: dict[str, object]) -> None:
    assert _lane(**state).take_rule() is Take.STORE


def test_a_new_lane_neither_hands_over_nor_sends_ahead() -> None:
    lane: dispatch.Lane[str, str] = _Lane(QUEUE_GROUP)
    assert lane.take_rule() is Take.STORE
    assert lane.ahead() is None
