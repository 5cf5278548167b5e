"""The sharing rule between replicas (``routing/sharing.py``) on plain data: a model of one
subscription's unread entries and the replicas fetching from it."""

import dataclasses
import random

import pytest

from shoal_broker.routing.sharing import LAPSE_MS, Share, grant, others_idle, others_present

NOW = 1_000_000


@dataclasses.dataclass
class Model:
    """Unread entries of a subscription, the replicas' records, and who took how many."""

    shares: dict[str, Share] = dataclasses.field(default_factory=dict)
    available: int = 0
    taken: dict[str, int] = dataclasses.field(default_factory=dict)
    now: int = NOW

    def fetch(self, replica: str, credit: int = 1000, consumers: int = 1) -> int:
        granted = min(grant(self.shares, replica, consumers, credit, self.available, self.now),
                      self.available)  # fmt: skip
        self.available -= granted
        self.taken[replica] = self.taken.get(replica, 0) + granted
        return granted

    def join(self, *replicas: str, credit: int = 1000, consumers: int = 1) -> None:
        """Each replica's first fetch, finding nothing: its record exists from then on."""
        for replica in replicas:
            self.fetch(replica, credit, consumers)


def test_a_replica_alone_takes_what_its_credit_allows() -> None:
    model = Model(available=30)
    assert model.fetch('a', credit=20) == 20
    assert model.shares['a'].reserved == 0
    assert not others_present(model.shares, 'a')


def test_a_replica_alone_writes_its_record_once() -> None:
    model = Model(available=5)
    model.fetch('a', credit=20)
    model.now += 100
    model.fetch('a', credit=7, consumers=2)  # alone: nothing to share, nothing to write
    assert model.shares == {'a': Share(consumers=1, credit=20, fetched_ms=NOW)}


def test_a_burst_is_split_between_two_replicas_whoever_fetches_first() -> None:
    model = Model()
    model.join('a', 'b')
    model.available = 20
    assert model.fetch('a') == 10  # the producer's replica, right after its publish
    assert model.fetch('a') == 0  # the rest waits for b
    assert model.fetch('b') == 10
    assert model.available == 0


def test_an_odd_burst_leaves_one_over_to_the_round_robin() -> None:
    model = Model()
    model.join('a', 'b')
    model.available = 21
    model.fetch('a')
    model.fetch('b')
    assert sorted(model.taken.values()) == [10, 11]


@pytest.mark.parametrize(
    ('weights', 'expected'), [((1000, 1000), (50, 50)), ((3000, 1000), (75, 25))]
)
def test_at_a_trickle_messages_go_round_in_proportion_to_free_credit(
    weights: tuple[int, int], expected: tuple[int, int]
) -> None:
    model = Model()
    model.join('a', credit=weights[0], consumers=weights[0] // 1000)
    model.join('b', credit=weights[1])
    for _ in range(100):  # one message at a time; the publishing replica fetches first
        model.available += 1
        model.fetch('a', credit=weights[0], consumers=weights[0] // 1000)
        model.fetch('b', credit=weights[1])
        model.now += 16
    assert (model.taken['a'], model.taken['b']) == expected


def test_successive_messages_alternate_between_equal_replicas() -> None:
    model = Model()
    model.join('a', 'b')
    order = []
    for _ in range(6):
        model.available += 1
        before = dict(model.taken)
        model.fetch('a')
        model.fetch('b')
        order.append(next(r for r in 'ab' if model.taken[r] > before.get(r, 0)))
    assert order in (list('ababab'), list('bababa'))


def test_more_consumers_with_more_free_credit_get_more() -> None:
    model = Model()
    model.join('a', credit=3000, consumers=3)
    model.join('b', credit=1000)
    model.available = 200
    model.fetch('a', credit=3000, consumers=3)
    model.fetch('b')
    assert model.taken == {'a': 150, 'b': 50}


def test_a_replica_without_free_credit_gets_nothing_reserved() -> None:
    shares = {'a': Share(consumers=1, credit=1000), 'b': Share(consumers=1, credit=0)}
    model = Model(shares, available=50)
    assert model.fetch('a') == 50
    assert shares['b'].reserved == 0


def test_a_reservation_beyond_the_fetching_replicas_credit_goes_back_to_everyone() -> None:
    model = Model()
    model.join('a', 'b')
    model.available = 40
    model.fetch('b')  # reserves 20 for a
    assert model.shares['a'].reserved == 20
    assert model.fetch('a', credit=5) == 5
    assert model.shares['a'].reserved == 0
    assert model.fetch('b') == 15  # a has no credit left: the 15 it gave up are b's


def test_a_reservation_nobody_collects_lapses() -> None:
    model = Model()
    model.join('a', 'b')
    model.available = 20
    model.fetch('a')
    model.now += LAPSE_MS  # not yet: b may still come
    assert model.fetch('a') == 0
    model.now += 1
    assert model.fetch('a') == 10  # b's 10 lapsed, and b is away until it fetches again
    model.available = 10
    assert model.fetch('a') == 10
    model.fetch('b')  # back
    model.available = 10
    assert model.fetch('a') == 5


def test_a_replica_collects_its_reservation_however_late_as_far_as_its_credit_goes() -> None:
    model = Model()
    model.join('a', 'b')
    model.available = 20
    model.fetch('a')
    model.now += 2 * LAPSE_MS
    model.fetch('b', credit=1)  # what its credit does not take goes back to everyone
    assert model.taken['b'] == 1
    assert model.shares['b'].reserved == 0


def test_reservations_never_exceed_what_is_available() -> None:
    model = Model()
    model.join('a', 'b', 'c')
    model.available = 30
    model.fetch('a')
    model.available = 4  # the others' 20 shrank meanwhile (expired, taken by a lapse elsewhere)
    model.fetch('a')
    assert sum(s.reserved for s in model.shares.values()) <= 4


def test_when_the_others_are_idle_the_rule_grants_all_it_can_and_leaves_them_as_they_were() -> None:
    """What lets ``fetch.lua`` skip the count and the others' records (``others_idle``)."""
    rng = random.Random(37)
    idle_seen = 0
    for _ in range(2000):
        shares = {
            replica: Share(
                consumers=rng.choice([0, 1, 3]),
                credit=rng.choice([0, 0, 5, 200]),
                reserved=rng.choice([0, 0, 0, 7]),
                current=rng.randrange(-400, 400),
                fetched_ms=rng.randrange(0, 3000),
                reserved_ms=rng.randrange(0, 3000),
            )
            for replica in 'abc'
        }
        if not others_present(shares, 'a') or not others_idle(shares, 'a'):
            continue
        idle_seen += 1
        before = {r: dataclasses.replace(s) for r, s in shares.items() if r != 'a'}
        credit, available = rng.choice([1, 5, 200, 600]), rng.choice([0, 1, 4, 150, 5000])
        assert grant(shares, 'a', 2, credit, available, 3000) == min(credit, available)
        assert {r: s for r, s in shares.items() if r != 'a'} == before
        assert (shares['a'].reserved, shares['a'].credit) == (0, credit - min(credit, available))
    assert idle_seen > 50
