"""The pure routing semantics: disposition outcomes, priority bands, expiry, address resolution."""

import re

import pytest

from shoal_broker.errors import AddressNotFound, InvalidField, NotAllowed
from shoal_broker.routing import addresses, outcomes
from shoal_broker.routing.outcomes import Action, Decision, Disposition, Outcome
from shoal_broker.settings import AddressKind, RoutingSettings

QUEUE, TOPIC = AddressKind.QUEUE, AddressKind.TOPIC

# -- outcomes.decide --------------------------------------------------------------------------

ACK = Decision(Action.ACK)
REJECTED = Decision(Action.DEAD_LETTER, reason='rejected')
RETURN = Decision(Action.RETURN)
RETURN_FAILED = Decision(Action.RETURN, delivery_failed=True)

DECISIONS: list[tuple[str, Disposition, int, int, Decision]] = [
    ('accepted', Disposition(Outcome.ACCEPTED), 0, 10, ACK),
    ('accepted at the limit', Disposition(Outcome.ACCEPTED), 9, 10, ACK),
    ('accepted with failure flags', Disposition(Outcome.ACCEPTED, True, True), 9, 10, ACK),
    ('rejected', Disposition(Outcome.REJECTED), 0, 10, REJECTED),
    ('rejected unlimited', Disposition(Outcome.REJECTED), 0, 0, REJECTED),
    ('released', Disposition(Outcome.RELEASED), 0, 10, RETURN),
    ('released at the limit', Disposition(Outcome.RELEASED), 9, 10, RETURN),
    ('released past the limit', Disposition(Outcome.RELEASED), 50, 10, RETURN),
    ('modified not failed', Disposition(Outcome.MODIFIED), 9, 10, RETURN),
    ('modified failed', Disposition(Outcome.MODIFIED, delivery_failed=True), 0, 10, RETURN_FAILED),
    ('modified failed below limit', Disposition(Outcome.MODIFIED, True), 8, 10, RETURN_FAILED),
    (
        'modified failed reaching the limit',
        Disposition(Outcome.MODIFIED, delivery_failed=True),
        9,
        10,
        Decision(Action.DEAD_LETTER, reason='max delivery attempts (10)'),
    ),
    (
        'modified failed past the limit',
        Disposition(Outcome.MODIFIED, delivery_failed=True),
        12,
        10,
        Decision(Action.DEAD_LETTER, reason='max delivery attempts (10)'),
    ),
    (
        'modified failed with a limit of one',
        Disposition(Outcome.MODIFIED, delivery_failed=True),
        0,
        1,
        Decision(Action.DEAD_LETTER, reason='max delivery attempts (1)'),
    ),
    ('modified failed unlimited', Disposition(Outcome.MODIFIED, True), 10**6, 0, RETURN_FAILED),
    (
        'modified undeliverable here',
        Disposition(Outcome.MODIFIED, undeliverable_here=True),
        0,
        10,
        Decision(Action.RETURN, exclude_consumer=True),
    ),
    (
        'modified failed and undeliverable here',
        Disposition(Outcome.MODIFIED, delivery_failed=True, undeliverable_here=True),
        3,
        10,
        Decision(Action.RETURN, delivery_failed=True, exclude_consumer=True),
    ),
    (
        'released is never undeliverable here',
        Disposition(Outcome.RELEASED, undeliverable_here=True),
        0,
        10,
        RETURN,
    ),
]


@pytest.mark.parametrize(
    ('name', 'disposition', 'count', 'max_attempts', 'expected'),
    DECISIONS,
    ids=[d[0] for d in DECISIONS],
)
def test_decide_turns_each_outcome_into_the_documented_action(
    name: str, disposition: Disposition, count: int, max_attempts: int, expected: Decision
) -> None:
    assert outcomes.decide(disposition, count, max_attempts) == expected


def test_released_message_keeps_its_count() -> None:
    decision = outcomes.decide(Disposition(Outcome.RELEASED), 3, 10)
    assert decision.action is Action.RETURN
    assert decision.delivery_failed is False


def test_the_attempt_that_reaches_the_limit_is_the_one_dead_lettered() -> None:
    failed = Disposition(Outcome.MODIFIED, delivery_failed=True)
    actions = [outcomes.decide(failed, count, 3).action for count in range(4)]
    assert actions == [Action.RETURN, Action.RETURN, Action.DEAD_LETTER, Action.DEAD_LETTER]


@pytest.mark.parametrize(
    ('priority', 'band'),
    [(0, 9), (1, 8), (4, 5), (5, 4), (7, 2), (9, 0), (10, 0), (255, 0)],
)
def test_each_jms_priority_has_its_own_band_priority_nine_first(priority: int, band: int) -> None:
    assert outcomes.priority_band(priority) == band


@pytest.mark.parametrize(
    ('arrival', 'ttl', 'absolute', 'expected'),
    [
        (1000, None, None, 0),
        (1000, 0, 0, 0),
        (1000, 500, None, 1500),
        (1000, None, 9000, 9000),
        (1000, 500, 9000, 1500),
        (1000, 9000, 2000, 2000),
        (1000, 0, 2000, 2000),
        (1000, 500, 0, 1500),
    ],
)
def test_expiry_ms_is_the_earlier_of_ttl_and_absolute_expiry(
    arrival: int, ttl: int | None, absolute: int | None, expected: int
) -> None:
    assert outcomes.expiry_ms(arrival, ttl, absolute) == expected


# -- addresses.resolve ------------------------------------------------------------------------


@pytest.mark.parametrize('existing', [QUEUE, TOPIC])
@pytest.mark.parametrize('auto_create', [True, False])
def test_an_existing_address_keeps_its_kind_and_is_not_created(
    existing: AddressKind, auto_create: bool
) -> None:
    settings = RoutingSettings(auto_create_queues=auto_create, auto_create_topics=auto_create)
    for requested in (None, existing):
        resolution = addresses.resolve('a', requested, existing, settings)
        assert resolution == addresses.Resolution(existing, create=False)


@pytest.mark.parametrize(('requested', 'existing'), [(QUEUE, TOPIC), (TOPIC, QUEUE)])
def test_asking_for_the_other_kind_of_an_existing_address_is_not_allowed(
    requested: AddressKind, existing: AddressKind
) -> None:
    with pytest.raises(NotAllowed, match=f'is a {existing}, not a {requested}'):
        addresses.resolve('orders', requested, existing, RoutingSettings())


@pytest.mark.parametrize('kind', [QUEUE, TOPIC])
def test_a_missing_address_is_created_with_the_requested_kind(kind: AddressKind) -> None:
    other = TOPIC if kind is QUEUE else QUEUE
    settings = RoutingSettings(default_address_kind=other)
    assert addresses.resolve('a', kind, None, settings) == addresses.Resolution(kind, create=True)


@pytest.mark.parametrize('default', [QUEUE, TOPIC])
def test_a_missing_address_with_no_requested_kind_gets_the_default(default: AddressKind) -> None:
    settings = RoutingSettings(default_address_kind=default)
    assert addresses.resolve('a', None, None, settings) == addresses.Resolution(default, True)


@pytest.mark.parametrize(
    ('requested', 'default', 'queues', 'topics', 'created'),
    [
        (QUEUE, QUEUE, False, True, None),
        (QUEUE, QUEUE, True, False, QUEUE),
        (TOPIC, QUEUE, True, False, None),
        (TOPIC, QUEUE, False, True, TOPIC),
        (None, QUEUE, False, True, None),
        (None, TOPIC, True, False, None),
        (None, TOPIC, False, True, TOPIC),
        (None, QUEUE, True, False, QUEUE),
    ],
)
def test_auto_creation_is_switched_per_kind(
    requested: AddressKind | None,
    default: AddressKind,
    queues: bool,
    topics: bool,
    created: AddressKind | None,
) -> None:
    settings = RoutingSettings(
        auto_create_queues=queues, auto_create_topics=topics, default_address_kind=default
    )
    if created is None:
        with pytest.raises(AddressNotFound, match="'nowhere'"):
            addresses.resolve('nowhere', requested, None, settings)
    else:
        resolution = addresses.resolve('nowhere', requested, None, settings)
        assert resolution == addresses.Resolution(created, create=True)


def test_refusals_carry_their_amqp_conditions() -> None:
    off = RoutingSettings(auto_create_queues=False)
    with pytest.raises(AddressNotFound) as missing:
        addresses.resolve('a', QUEUE, None, off)
    assert missing.value.condition == 'amqp:not-found'
    with pytest.raises(NotAllowed) as mismatch:
        addresses.resolve('a', TOPIC, QUEUE, RoutingSettings())
    assert mismatch.value.condition == 'amqp:not-allowed'


# -- capabilities and x-opt-jms-dest ----------------------------------------------------------


@pytest.mark.parametrize(
    ('capabilities', 'kind'),
    [
        ([], None),
        (['shared', 'global'], None),
        (['queue'], QUEUE),
        (['temporary-queue'], QUEUE),
        (['topic'], TOPIC),
        (['temporary-topic'], TOPIC),
        (('shared', 'topic'), TOPIC),
        (iter(['queue']), QUEUE),
        (['QUEUE'], None),
    ],
)
def test_kind_from_capabilities(capabilities: list[str], kind: AddressKind | None) -> None:
    assert addresses.kind_from_capabilities(capabilities) == kind


@pytest.mark.parametrize(
    ('code', 'kind'),
    [
        (0, QUEUE),
        (1, TOPIC),
        (2, QUEUE),
        (3, TOPIC),
        (4, None),
        (-1, None),
        (255, None),
        (None, None),
        ('0', None),
        (b'\x00', None),
        (0.0, None),
    ],
)
def test_kind_from_jms_dest_reads_the_qpid_jms_codes(
    code: object, kind: AddressKind | None
) -> None:
    assert addresses.kind_from_jms_dest(code) == kind


# -- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    'name', ['orders', 'a', 'a/b.c-d_e', 'temp-queue://x', 'x' * 1024, 'ümlaut', 'with space']
)
def test_check_name_returns_a_usable_name(name: str) -> None:
    assert addresses.check_name(name) == name


@pytest.mark.parametrize(
    ('name', 'message'),
    [
        (None, 'required'),
        ('', 'required'),
        ('x' * 1025, 'longer than 1024'),
        ('a\nb', 'control characters'),
        ('\x00', 'control characters'),
        ('tab\there', 'control characters'),
        ('end\x1f', 'control characters'),
    ],
)
def test_check_name_refuses_bad_names(name: str | None, message: str) -> None:
    with pytest.raises(InvalidField, match=message) as refused:
        addresses.check_name(name)
    assert refused.value.condition == 'amqp:invalid-field'


@pytest.mark.parametrize('kind', [QUEUE, TOPIC])
def test_temporary_addresses_are_unique_and_prefixed_by_kind(kind: AddressKind) -> None:
    names = {addresses.temporary_address(kind) for _ in range(100)}
    assert len(names) == 100
    pattern = re.compile(rf'temp-{kind.value}://[0-9a-f-]{{36}}')
    assert all(pattern.fullmatch(name) for name in names)
    assert all(addresses.check_name(name) == name for name in names)
