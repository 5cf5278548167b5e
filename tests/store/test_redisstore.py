"""The Redis store's contract on a real redis-server: the Lua scripts are the semantics."""

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence

import pytest
import redis.asyncio
from processes import RedisServer
from startedstores import started_store

from shoal_broker.errors import AddressNotFound, BrokerError, StoreUnavailable
from shoal_broker.routing.storage import (
    NORMAL_BAND,
    QUEUE_GROUP,
    BrowseCursor,
    Entry,
    OutgoingMessage,
)
from shoal_broker.settings import AddressKind
from shoal_broker.store import keys, scripts
from shoal_broker.store.redisstore import RedisStore
from shoal_broker.store.upkeep import TRIM_STEP_ENTRIES


@pytest.fixture
def name() -> str:
    return f'addr-{uuid.uuid4().hex[:10]}'


def msg(body: bytes, band: int = NORMAL_BAND, expiry_ms: int = 0) -> OutgoingMessage:
    return OutgoingMessage(band=band, header=b'', rest=body, expiry_ms=expiry_ms)


async def queue_then_fetch(
    store: RedisStore, name: str, *, published: int, fetched: int
) -> list[Entry]:
    """A new queue ``name`` holding messages b'0', b'1', ...; the first ``fetched`` taken."""
    await store.registry.create_address(name, AddressKind.QUEUE)
    for i in range(published):
        await store.messages.publish(name, AddressKind.QUEUE, msg(b'%d' % i))
    return list(await store.messages.fetch(name, QUEUE_GROUP, fetched))


async def test_a_queue_hands_out_each_entry_once_returned_ones_first(
    store: RedisStore, name: str
) -> None:
    await store.registry.create_address(name, AddressKind.QUEUE)
    for body in (b'a', b'b', b'c'):
        assert await store.messages.publish(name, AddressKind.QUEUE, msg(body)) is True
    first = await store.messages.fetch(name, QUEUE_GROUP, 2)
    assert [e.rest for e in first] == [b'a', b'b']
    await store.messages.release(name, QUEUE_GROUP, first[1], delivery_failed=True)
    await store.messages.release(name, QUEUE_GROUP, first[0], delivery_failed=False)
    # the first fetch went in bulk for the next ones: this one's plain read took c beside the
    # returned a and b, and gave it back behind them for a later fetch (Messages._fetch_op)
    again: list[Entry] = []
    for _ in range(100):
        again += await store.messages.fetch(name, QUEUE_GROUP, 10)
        if len(again) >= 3:
            break
        await asyncio.sleep(0.02)
    assert [(e.rest, e.delivery_count) for e in again] == [(b'a', 0), (b'b', 1), (b'c', 0)]
    for entry in again:
        await store.messages.ack(name, QUEUE_GROUP, entry)
    assert await store.messages.fetch(name, QUEUE_GROUP, 10) == []


async def test_a_higher_priority_band_is_served_first(store: RedisStore, name: str) -> None:
    await store.registry.create_address(name, AddressKind.QUEUE)
    await store.messages.publish(name, AddressKind.QUEUE, msg(b'normal'))
    await store.messages.publish(name, AddressKind.QUEUE, msg(b'high', band=0))
    assert [e.rest for e in await store.messages.fetch(name, QUEUE_GROUP, 10)] == [
        b'high',
        b'normal',
    ]


@pytest.fixture(params=['resp3', 'resp2'])
async def any_protocol_store(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[RedisStore]:
    """A store speaking redis-py's default protocol (RESP3), or RESP2 (``?protocol=2``): a plain
    XREADGROUP's reply is a map in one and a list in the other."""
    query = '?protocol=2' if request.param == 'resp2' else ''
    async with started_store(redis_server.url + query) as s:
        yield s


async def test_a_fetch_in_bulk_reads_every_field_and_lets_no_new_entry_overtake_a_returned_one(
    any_protocol_store: RedisStore, name: str
) -> None:
    """After a big fetch, a subscription's normal band is read by a plain XREADGROUP beside
    fetch.lua. Every field survives that read. When returned entries turn up, the new entries
    read with them go back behind them, and the fetches after that are the script's alone."""
    store = any_protocol_store
    await store.registry.create_address(name, AddressKind.QUEUE)
    for i in range(20):
        await store.messages.publish(name, AddressKind.QUEUE, msg(b'warm-%d' % i))
    for entry in await store.messages.fetch(name, QUEUE_GROUP, 20):  # the next fetch is in bulk
        await store.messages.ack(name, QUEUE_GROUP, entry)
    for i in range(20):
        expiry, origin = (4_102_444_800_000 + i, f'conn-{i}') if i % 2 else (0, '')
        await store.messages.publish(
            name,
            AddressKind.QUEUE,
            OutgoingMessage(NORMAL_BAND, b'h%d' % i, b'%d' % i, expiry, origin),
        )

    sent = store.cycles.commands
    bulk = await store.messages.fetch(name, QUEUE_GROUP, 20)
    assert store.cycles.commands - sent == 2  # the script, then the plain XREADGROUP

    assert [(e.band, e.header, e.rest, e.expiry_ms, e.origin, e.delivery_count) for e in bulk] == [
        (NORMAL_BAND, b'h%d' % i, b'%d' % i, 4_102_444_800_000 + i if i % 2 else 0,
         f'conn-{i}' if i % 2 else '', 0)
        for i in range(20)
    ]  # fmt: skip
    for entry in bulk[3:]:
        await store.messages.ack(name, QUEUE_GROUP, entry)
    for entry in bulk[:3]:
        await store.messages.release(name, QUEUE_GROUP, entry, delivery_failed=True)
    await store.messages.publish(name, AddressKind.QUEUE, msg(b'high', band=0))
    for body in (b'new-1', b'new-2'):
        await store.messages.publish(name, AddressKind.QUEUE, msg(body))

    returned = await store.messages.fetch(name, QUEUE_GROUP, 2)
    rest = await store.messages.fetch(name, QUEUE_GROUP, 20)

    # priority 9 first; then, within priority 4, the returned entries before the new ones
    assert [(e.rest, e.delivery_count) for e in returned] == [(b'high', 0), (b'0', 1)]
    assert [(e.rest, e.delivery_count) for e in rest] == [
        (b'1', 1),
        (b'2', 1),
        (b'new-1', 0),
        (b'new-2', 0),
    ]
    assert await store.messages.fetch(name, QUEUE_GROUP, 20) == []


async def test_a_fetch_started_by_a_bulk_fetchs_callback_finds_what_it_gave_back_first(
    store: RedisStore, name: str
) -> None:
    """A subscription fetches again from its fetch's own callback when credit came meanwhile.
    New entries that a fetch in bulk read beside a returned one go back behind it; that next
    fetch must find them there, not newer entries first (test_limits once saw entry 123
    delivered before 100-122)."""
    await store.registry.create_address(name, AddressKind.QUEUE)
    for i in range(20):
        await store.messages.publish(name, AddressKind.QUEUE, msg(b'warm-%d' % i))
    for entry in await store.messages.fetch(name, QUEUE_GROUP, 20):  # the next fetches are in bulk
        await store.messages.ack(name, QUEUE_GROUP, entry)
    await store.messages.publish(name, AddressKind.QUEUE, msg(b'returned'))
    (entry,) = await store.messages.fetch(name, QUEUE_GROUP, 1)
    await store.messages.release(name, QUEUE_GROUP, entry, delivery_failed=False)
    for body in (b'd', b'e', b'f', b'g'):
        await store.messages.publish(name, AddressKind.QUEUE, msg(body))

    second: asyncio.Future[list[bytes]] = asyncio.get_running_loop().create_future()

    def fetched_again(entries: Sequence[Entry] | None, error: BrokerError | None) -> None:
        second.set_result([e.rest for e in entries or ()])

    def fetched(entries: Sequence[Entry] | None, error: BrokerError | None) -> None:
        assert [e.rest for e in entries or ()] == [b'returned']  # d, e, f went back
        store.messages.fetch_then(name, QUEUE_GROUP, 10, fetched_again)  # as LocalSubscription.kick

    store.messages.fetch_then(name, QUEUE_GROUP, 3, fetched)
    assert await second == [b'd', b'e', b'f', b'g']


async def test_another_replica_can_take_a_returned_entry(
    store: RedisStore, redis_server: RedisServer, name: str
) -> None:
    other = RedisStore.from_url(redis_server.url, 'other-replica')
    await other.start()
    try:
        await store.registry.create_address(name, AddressKind.QUEUE)
        await store.messages.publish(name, AddressKind.QUEUE, msg(b'x'))
        (entry,) = await store.messages.fetch(name, QUEUE_GROUP, 1)
        assert await other.messages.fetch(name, QUEUE_GROUP, 1) == []  # held by the first replica
        await store.messages.release(name, QUEUE_GROUP, entry, delivery_failed=False)
        taken = await other.messages.fetch(name, QUEUE_GROUP, 1)
        assert [e.rest for e in taken] == [b'x']
    finally:
        await other.close()


async def test_a_topic_keeps_nothing_without_subscriptions_and_new_ones_see_only_later_messages(
    store: RedisStore, name: str
) -> None:
    await store.registry.create_address(name, AddressKind.TOPIC)
    assert await store.messages.publish(name, AddressKind.TOPIC, msg(b'lost')) is False
    await store.registry.create_subscription(name, 'early', from_start=False)
    await store.messages.publish(name, AddressKind.TOPIC, msg(b'one'))
    await store.registry.create_subscription(name, 'late', from_start=False)
    await store.messages.publish(name, AddressKind.TOPIC, msg(b'two'))
    assert [e.rest for e in await store.messages.fetch(name, 'early', 10)] == [b'one', b'two']
    assert [e.rest for e in await store.messages.fetch(name, 'late', 10)] == [b'two']


async def test_browsing_skips_consumed_entries_and_consumes_nothing(
    store: RedisStore, name: str
) -> None:
    await store.registry.create_address(name, AddressKind.QUEUE)
    for body in (b'1', b'2', b'3', b'4'):
        await store.messages.publish(name, AddressKind.QUEUE, msg(body))
    taken = await store.messages.fetch(name, QUEUE_GROUP, 2)
    await store.messages.ack(name, QUEUE_GROUP, taken[0])  # 1 consumed, 2 in flight
    seen, cursor = await store.messages.browse(name, QUEUE_GROUP, BrowseCursor(), 2)
    assert [e.rest for e in seen] == [b'2', b'3']
    seen, cursor = await store.messages.browse(name, QUEUE_GROUP, cursor, 10)
    assert [e.rest for e in seen] == [b'4']
    assert (await store.messages.browse(name, QUEUE_GROUP, cursor, 10))[0] == []
    assert [e.rest for e in await store.messages.fetch(name, QUEUE_GROUP, 10)] == [b'3', b'4']


async def test_messages_published_in_one_cycle_share_one_script_call_and_keep_their_order(
    store: RedisStore, name: str
) -> None:
    """publish_then joins the cycle's op for its address and band; a publish() between them
    (awaited by its caller) starts a new one, so nobody's message overtakes another's."""
    await store.registry.create_address(name, AddressKind.QUEUE)
    answers: list[tuple[list[str], bool | None]] = []

    def stored(labels: list[str], kept: bool | None, error: BrokerError | None) -> None:
        answers.append((list(labels), kept if error is None else None))

    sent = store.cycles.commands
    for label in ('a', 'b'):
        store.messages.publish_then(name, AddressKind.QUEUE, msg(label.encode()), stored, label)
    between = store.messages.publish(name, AddressKind.QUEUE, msg(b'c'))
    for label in ('d', 'e'):
        store.messages.publish_then(name, AddressKind.QUEUE, msg(label.encode()), stored, label)

    def elsewhere(labels: list[str], kept: bool | None, error: BrokerError | None) -> None:
        answers.append((['elsewhere', *labels], kept))

    # not d-e's callback
    store.messages.publish_then(name, AddressKind.QUEUE, msg(b'f'), elsewhere, 'f')
    assert await between is True
    await store.flush()
    # one answer per op, and an op answers one callback
    assert answers == [(['a', 'b'], True), (['d', 'e'], True), (['elsewhere', 'f'], True)]
    assert store.cycles.commands - sent == 1  # the four ops of one address and band: one EVAL
    entries = await store.messages.fetch(name, QUEUE_GROUP, 10)
    assert [e.rest for e in entries] == [b'a', b'b', b'c', b'd', b'e', b'f']


async def test_every_field_of_the_messages_of_one_cycle_is_stored_as_sent(
    store: RedisStore, name: str
) -> None:
    """A cycle's messages go to the publish script as arguments encoded while they arrive: any
    header, body (empty, or longer than the cached bulk-string heads), expiry and origin comes
    back from a fetch byte for byte, in order, whichever op of the cycle carried it."""
    await store.registry.create_address(name, AddressKind.QUEUE)
    expiry = 4_102_444_800_000  # 2100-01-01: not expired when fetched
    sent = [
        OutgoingMessage(0, b'\x00Sp\xc0\x02\x01\x41', b'x' * 1024, 0, 'conn-a'),
        OutgoingMessage(0, b'', b'', expiry, ''),
        OutgoingMessage(0, b'h\r\n', b'\r\n$3\r\n' * 10_000, 0, 'conn-\u00e9'),  # RESP-like
        OutgoingMessage(0, b'\x00Sp\xc0\x02\x01\x41', b'y', expiry + 1, 'conn-a'),
        OutgoingMessage(0, b'', b'z' * 70_000, 0, 'conn-a'),
    ]
    answered: list[tuple[list[int], bool | None, BrokerError | None]] = []

    def stored(indexes: list[int], kept: bool | None, error: BrokerError | None) -> None:
        answered.append((list(indexes), kept, error))

    for i in (0, 1):
        store.messages.publish_then(name, AddressKind.QUEUE, sent[i], stored, i)
    between = store.messages.publish(name, AddressKind.QUEUE, sent[2])  # an op of its own
    for i in (3, 4):
        store.messages.publish_then(name, AddressKind.QUEUE, sent[i], stored, i)
    assert await between is True
    await store.flush()
    assert answered == [([0, 1], True, None), ([3, 4], True, None)]
    entries = await store.messages.fetch(name, QUEUE_GROUP, 10)
    assert [(e.header, e.rest, e.expiry_ms, e.origin) for e in entries] == [
        (m.header, m.rest, m.expiry_ms, m.origin) for m in sent
    ]


async def test_acks_that_nobody_waits_for_go_out_as_one_xack_per_cycle(
    store: RedisStore, redis_server: RedisServer, name: str
) -> None:
    entries = await queue_then_fetch(store, name, published=5, fetched=5)
    # counted once
    await store.messages.release(name, QUEUE_GROUP, entries[4], delivery_failed=True)
    entries[4:] = await store.messages.fetch(name, QUEUE_GROUP, 1)
    assert entries[4].delivery_count == 1
    client = redis.asyncio.Redis.from_url(redis_server.url)
    k = keys.AddressKeys.of(name)
    assert await client.hlen(k.delivery_counts(QUEUE_GROUP)) == 1
    sent = store.cycles.commands
    store.messages.ack_nowait(name, QUEUE_GROUP, entries[:1])
    store.messages.ack_nowait(name, QUEUE_GROUP, entries[1:])  # a consumer's fetch, say
    await store.flush()
    assert store.cycles.commands - sent == 2  # one XACK of five ids, one HDEL of the counted one
    assert (await client.xpending(k.streams[NORMAL_BAND], QUEUE_GROUP))['pending'] == 0
    assert await client.hlen(k.delivery_counts(QUEUE_GROUP)) == 0
    await client.aclose()
    assert await store.messages.fetch(name, QUEUE_GROUP, 10) == []


async def test_acks_of_both_bands_in_one_call_reach_each_bands_stream(
    store: RedisStore, redis_server: RedisServer, name: str
) -> None:
    await store.registry.create_address(name, AddressKind.QUEUE)
    for body, band in ((b'n0', NORMAL_BAND), (b'h0', 0), (b'n1', NORMAL_BAND), (b'h1', 0)):
        await store.messages.publish(name, AddressKind.QUEUE, msg(body, band=band))
    entries = list(await store.messages.fetch(name, QUEUE_GROUP, 10))
    by_body = {e.rest: e for e in entries}
    sent = store.cycles.commands
    store.messages.ack_nowait(name, QUEUE_GROUP, [by_body[b] for b in (b'n0', b'h0', b'n1', b'h1')])
    await store.flush()
    assert store.cycles.commands - sent == 2  # one XACK per band's stream
    client = redis.asyncio.Redis.from_url(redis_server.url)
    for band in (NORMAL_BAND, 0):
        stream = f'shoal:{{a:{name}}}:p:{band}'
        assert (await client.xpending(stream, QUEUE_GROUP))['pending'] == 0
    await client.aclose()
    assert await store.messages.fetch(name, QUEUE_GROUP, 10) == []


async def test_trimming_removes_only_what_every_subscription_is_done_with(
    store: RedisStore, redis_server: RedisServer, name: str
) -> None:
    entries = await queue_then_fetch(store, name, published=5, fetched=3)
    await store.messages.ack(name, QUEUE_GROUP, entries[0])
    await store.messages.ack(name, QUEUE_GROUP, entries[2])  # entry 1 still pending
    await store.upkeep.trim()
    client = redis.asyncio.Redis.from_url(redis_server.url)
    assert await client.xlen(f'shoal:{{a:{name}}}:p:5') == 4  # only the oldest went
    await client.aclose()
    assert [e.rest for e in await store.messages.fetch(name, QUEUE_GROUP, 10)] == [b'3', b'4']


async def test_a_big_consumed_backlog_is_trimmed_in_bounded_steps(
    own_store: RedisStore, own_redis: RedisServer, name: str
) -> None:
    """One trim.lua call removes at most its limit (whole stream nodes) and says the limit
    stopped it; ``trim`` calls again until everything consumed is gone. On a Redis of the
    test's own, where no session broker trims between the step and the pass (``own_redis``)."""
    store, redis_server = own_store, own_redis
    count = 2 * TRIM_STEP_ENTRIES + 500
    await store.registry.create_address(name, AddressKind.QUEUE)
    for start in range(0, count, 500):
        await asyncio.gather(
            *(
                store.messages.publish(name, AddressKind.QUEUE, msg(b'%d' % i))
                for i in range(start, start + 500)
            )
        )
    fetched: list[Entry] = []
    while len(fetched) < count:
        fetched += await store.messages.fetch(name, QUEUE_GROUP, 500)
    await asyncio.gather(*(store.messages.ack(name, QUEUE_GROUP, entry) for entry in fetched))
    stream = f'shoal:{{a:{name}}}:p:5'
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        levels = keys.AddressKeys.of(name).levels
        one_step, more = await client.eval(
            scripts.source('trim'), 2, stream, levels, TRIM_STEP_ENTRIES
        )
        assert 0 < one_step <= TRIM_STEP_ENTRIES
        assert more == 1
        assert await client.xlen(stream) == count - one_step
        assert await store.upkeep.trim() == count - one_step
        assert await client.xlen(stream) == 0
        trimmed = await client.eval(scripts.source('trim'), 2, stream, levels, TRIM_STEP_ENTRIES)
        assert trimmed == [0, 0]
    finally:
        await client.aclose()


async def test_a_consumed_part_short_of_the_limit_is_trimmed_in_one_call(
    own_store: RedisStore, own_redis: RedisServer, name: str
) -> None:
    """Whole nodes, then the less-than-a-node rest exactly, in the same call, which says the
    stream is trimmed: not one call for the nodes, one for the rest, and one finding nothing."""
    count, consumed = 350, 250  # nodes of 100 small entries: two whole, then half of one
    await own_store.registry.create_address(name, AddressKind.QUEUE)
    await asyncio.gather(
        *(own_store.messages.publish(name, AddressKind.QUEUE, msg(b'%d' % i)) for i in range(count))
    )
    fetched = await own_store.messages.fetch(name, QUEUE_GROUP, consumed)
    await asyncio.gather(*(own_store.messages.ack(name, QUEUE_GROUP, entry) for entry in fetched))
    k = keys.AddressKeys.of(name)
    client = redis.asyncio.Redis.from_url(own_redis.url)
    try:
        trimmed = await client.eval(
            scripts.source('trim'), 2, k.streams[5], k.levels, TRIM_STEP_ENTRIES
        )
        assert trimmed == [consumed, 0]
        assert await client.xlen(k.streams[5]) == count - consumed
    finally:
        await client.aclose()


async def test_scripts_are_reloaded_after_redis_forgets_them(
    store: RedisStore, redis_server: RedisServer, name: str
) -> None:
    await store.registry.create_address(name, AddressKind.QUEUE)
    client = redis.asyncio.Redis.from_url(redis_server.url)
    await client.script_flush()
    await client.aclose()
    assert await store.messages.publish(name, AddressKind.QUEUE, msg(b'after flush')) is True
    assert [e.rest for e in await store.messages.fetch(name, QUEUE_GROUP, 1)] == [b'after flush']


async def test_deleting_an_address_removes_its_keys(
    store: RedisStore, redis_server: RedisServer, name: str
) -> None:
    await store.registry.create_address(name, AddressKind.QUEUE)
    await store.messages.publish(name, AddressKind.QUEUE, msg(b'x'))
    await store.registry.delete_address(name)
    assert await store.registry.address_kind(name) is None
    client = redis.asyncio.Redis.from_url(redis_server.url)
    assert await client.keys(keys.AddressKeys.of(name).tag + ':*') == []
    with pytest.raises(AddressNotFound):  # a replica that still thinks it exists is told
        await store.messages.publish(name, AddressKind.QUEUE, msg(b'too late'))
    assert await client.keys(keys.AddressKeys.of(name).tag + ':*') == []
    await client.aclose()


async def test_an_unreachable_redis_fails_operations_instead_of_pretending() -> None:
    down = RedisServer()
    s = RedisStore.from_url(down.url, 'r')
    await s.start()
    await s.registry.create_address('q', AddressKind.QUEUE)
    down.stop()
    with pytest.raises(StoreUnavailable):
        await s.messages.publish('q', AddressKind.QUEUE, msg(b'nowhere'))
    with pytest.raises(StoreUnavailable):
        await s.registry.address_kind('never-seen')
    await s.close()


async def test_stranded_entries_come_back_counted_as_possibly_delivered(
    store: RedisStore, name: str
) -> None:
    """What a replica claimed but no longer holds (a fetch reply lost, or an acknowledgement lost
    with its connection) is returned with one more attempt: delivered again, it says so."""
    fetched = await queue_then_fetch(store, name, published=3, fetched=3)
    held = {fetched[0].key}
    assert await store.messages.return_stranded(name, QUEUE_GROUP, held) == 2
    again = await store.messages.fetch(name, QUEUE_GROUP, 10)
    assert [(e.rest, e.delivery_count) for e in again] == [(b'1', 1), (b'2', 1)]


async def test_a_recovery_of_a_subscription_deleted_meanwhile_finds_nothing_to_return(
    store: RedisStore, name: str
) -> None:
    """A non-durable subscription's group goes when its last consumer leaves; a fetch that
    failed just before schedules a recovery, which must end quietly (NOGROUP), not raise."""
    await queue_then_fetch(store, name, published=2, fetched=2)
    assert await store.messages.return_stranded(name, 'nd:gone:1', set()) == 0


async def test_an_accepted_entry_whose_ack_is_queued_is_held_from_a_recovery(
    store: RedisStore, name: str
) -> None:
    """An ack waits for the next pipeline (or ACK_COALESCE_SECONDS): a recovery reading the
    pending list meanwhile leaves its entry alone, or an accepted message would be delivered
    again."""
    fetched = await queue_then_fetch(store, name, published=2, fetched=2)
    held = {e.key for e in fetched}
    assert await store.messages.return_stranded(name, QUEUE_GROUP, held) == 0  # its connection made
    store.messages.ack_nowait(name, QUEUE_GROUP, fetched[:1])
    assert await store.messages.return_stranded(name, QUEUE_GROUP, set()) == 1
    await store.flush()
    again = await store.messages.fetch(name, QUEUE_GROUP, 10)
    assert [(e.rest, e.delivery_count) for e in again] == [(b'1', 1)]


async def test_a_band_besides_the_default_is_read_while_listed_until_trimming_empties_it(
    store: RedisStore, redis_server: RedisServer, name: str
) -> None:
    """Only priority 4's band and those in the address's levels SET are read by a fetch; a
    publish at another priority lists its band, the trim that leaves it empty unlists it."""
    await store.registry.create_address(name, AddressKind.QUEUE)
    client = redis.asyncio.Redis.from_url(redis_server.url)
    levels = keys.AddressKeys.of(name).levels
    try:
        await store.messages.publish(name, AddressKind.QUEUE, msg(b'normal'))
        assert await client.smembers(levels) == set()
        await store.messages.publish(name, AddressKind.QUEUE, msg(b'low', band=9))
        await store.messages.publish(name, AddressKind.QUEUE, msg(b'high', band=0))
        assert await client.smembers(levels) == {b'0', b'9'}
        fetched = await store.messages.fetch(name, QUEUE_GROUP, 10)
        assert [(e.band, e.rest) for e in fetched] == [(0, b'high'), (5, b'normal'), (9, b'low')]
        for entry in fetched:
            await store.messages.ack(name, QUEUE_GROUP, entry)
        await store.upkeep.trim()
        assert await client.smembers(levels) == set()
    finally:
        await client.aclose()
