"""The management API's message operations on real brokers and Redis: browse, purge, delete,
move and retry, in every store mode (SHOAL_TEST_STORE)."""

from typing import Any

from amqpclient import Capabilities, connect, flush, receive_all, receiver, sender, settle
from mgmtapi import Api, quoted
from processes import BrokerProcess, wait_for
from proton import Delivery, Message
from redis.crc import key_slot

from shoal_broker.store import keys


def fill(broker: BrokerProcess, queue: str, count: int, **extra: Any) -> None:
    conn = connect(broker.url)
    snd = sender(conn, queue, Capabilities('queue'))
    for n in range(count):
        snd.send(Message(body=f'body-{n}', properties={'n': n, **extra}, subject=f's{n}'))
    conn.close()


def numbers(broker: BrokerProcess, queue: str, count: int) -> list[int]:
    conn = connect(broker.url)
    got = receive_all(receiver(conn, queue, credit=count), count)
    conn.close()
    return sorted(m.properties['n'] for m in got)


def browse_all(api: Api, queue: str, **query: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = api.get(f'/queues/{quoted(queue)}/messages', **query, **(
            {'cursor': cursor} if cursor else {}))  # fmt: skip
        found += page['messages']
        cursor = page['next']
        if cursor is None:
            return found


def test_browse_pages_without_consuming_and_filters_by_selector(
    broker: BrokerProcess, address: str
) -> None:
    fill(broker, address, 7)
    api = Api(broker)
    first = api.get(f'/queues/{quoted(address)}/messages', limit=3)
    assert [m['application_properties']['n'] for m in first['messages']] == [0, 1, 2]
    assert first['next'] is not None
    shown = first['messages'][0]
    assert shown['body'] == {'kind': 'text', 'size': 6, 'text': 'body-0'}
    assert shown['properties']['subject'] == 's0'
    assert shown['header']['delivery_count'] == 0
    assert shown['state'] == 'ready'
    assert [m['application_properties']['n'] for m in browse_all(api, address, limit=3)] == list(
        range(7)
    )
    matched = browse_all(api, address, selector="n >= 5 AND JMSType LIKE 's%'")
    assert [m['application_properties']['n'] for m in matched] == [5, 6]
    queue = api.get(f'/queues/{quoted(address)}')
    assert (queue['backlog'], queue['ready'], queue['in_flight']) == (7, 7, 0)
    assert queue['oldest_age_seconds'] is not None
    assert numbers(broker, address, 7) == list(range(7))  # browsing consumed nothing


def test_purge_and_delete_one_message(broker: BrokerProcess, address: str) -> None:
    fill(broker, address, 5)
    api = Api(broker)
    ids = [m['id'] for m in browse_all(api, address)]
    status, done = api.call('DELETE', f'/queues/{quoted(address)}/messages/{ids[1]}')
    assert (status, done) == (200, {'deleted': 1})
    status, again = api.call('DELETE', f'/queues/{quoted(address)}/messages/{ids[1]}')
    assert status == 404, again
    assert [m['application_properties']['n'] for m in browse_all(api, address)] == [0, 2, 3, 4]
    assert api.post(f'/queues/{quoted(address)}/purge') == {'purged': 4, 'in_flight': 0}
    assert browse_all(api, address) == []
    assert api.get(f'/queues/{quoted(address)}')['backlog'] == 0
    fill(broker, address, 1)
    assert numbers(broker, address, 1) == [0]  # the queue works on after the purge


def test_move_all_by_selector_and_by_id_to_other_addresses(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    source, target, other = f'{address}-src', f'{address}-dst', f'{address}-other'
    # on Redis Cluster the source and the target are on different slots: no script spans both
    assert key_slot(keys.AddressKeys.of(source).tag.encode()) != key_slot(
        keys.AddressKeys.of(target).tag.encode()
    )
    fill(broker, source, 10)
    fill(broker, target, 0)
    fill(broker, other, 0)
    api = Api(second_broker)  # any replica answers for all
    ids = [m['id'] for m in browse_all(api, source)]
    moved = api.post(f'/queues/{quoted(source)}/move', {'target': target, 'ids': ids[:2]})
    assert (moved['moved'], moved['targets']) == (2, {target: 2})
    moved = api.post(f'/queues/{quoted(source)}/move', {'target': other, 'selector': 'n >= 8'})
    assert moved['moved'] == 2
    moved = api.post(f'/queues/{quoted(source)}/move', {'target': target})
    assert (moved['moved'], moved['duplicated'], moved['in_flight']) == (6, 0, 0)
    assert browse_all(api, source) == []
    assert numbers(broker, target, 8) == list(range(8))
    assert numbers(second_broker, other, 2) == [8, 9]


def test_a_queue_is_counted_after_a_message_in_its_middle_is_removed(
    broker: BrokerProcess, address: str
) -> None:
    fill(broker, address, 3)
    api = Api(broker)
    middle = browse_all(api, address)[1]['id']
    assert api.call('DELETE', f'/queues/{quoted(address)}/messages/{middle}')[0] == 200
    # Redis cannot tell the lag past a removed entry: the entries are walked (binary bodies)
    assert api.get(f'/queues/{quoted(address)}')['backlog'] == 2
    assert api.get('/queues', search=address)['items'][0]['backlog'] == 2


def test_retry_sends_dead_letters_back_to_their_original_address(
    start_broker: Any, address: str
) -> None:
    dlq = f'{address}-dlq'
    b = start_broker(env={'SHOAL_DEAD_LETTER_ADDRESS': dlq})
    fill(b, address, 3)
    conn = connect(b.url)
    rcv = receiver(conn, address, credit=3)
    for _ in range(3):
        rcv.receive(timeout=10)
        settle(rcv, Delivery.REJECTED)
    flush(conn)
    api = Api(b)
    wait_for(lambda: api.call('GET', f'/queues/{quoted(dlq)}')[1].get('backlog') == 3, 10, 'dlq')
    dead = browse_all(api, dlq)
    assert {m['annotations']['x-opt-shoal-original-address'] for m in dead} == {address}
    retried = api.post(f'/queues/{quoted(dlq)}/retry', {'selector': 'n < 2'})
    assert (retried['moved'], retried['targets']) == (2, {address: 2})
    got = receive_all(rcv, 2)
    assert sorted(m.properties['n'] for m in got) == [0, 1]
    assert [m['application_properties']['n'] for m in browse_all(api, dlq)] == [2]
    conn.close()


def test_a_move_to_a_queue_at_its_backlog_limit_is_refused_and_loses_nothing(
    start_broker: Any, address: str
) -> None:
    source, full = f'{address}-src', f'{address}-full'
    b = start_broker(env={'SHOAL_MAX_BACKLOG_PER_ADDRESS': '4'})
    fill(b, source, 3)
    fill(b, full, 4)
    api = Api(b)
    status, refused = api.call('POST', f'/queues/{quoted(source)}/move', {'target': full})
    assert status == 409, refused
    assert 'backlog limit' in refused['error']
    assert refused['moved'] == 0
    assert len(browse_all(api, source)) == 3
    assert len(browse_all(api, full)) == 4
    assert numbers(b, source, 3) == [0, 1, 2]


def test_bad_input_gets_a_clear_4xx(broker: BrokerProcess, address: str) -> None:
    fill(broker, address, 2)
    api = Api(broker)
    q = f'/queues/{quoted(address)}'
    cases = [
        (api.call('GET', f'/queues/{quoted(address)}-nothing/messages'), 404, 'no address'),
        (api.call('GET', f'{q}/messages', selector='n >>> 1'), 400, 'bad selector'),
        (api.call('GET', f'{q}/messages', limit=100000), 400, 'limit'),
        (api.call('GET', f'{q}/messages', cursor='junk'), 400, 'cursor'),
        (api.call('POST', f'{q}/move', raw=b'{"target": '), 400, 'not JSON'),
        (api.call('POST', f'{q}/move', {'target': 5}), 400, 'target'),
        (api.call('POST', f'{q}/move', {'target': address + 'x', 'junk': 1}), 400, 'unknown'),
        (api.call('POST', f'{q}/move', {'target': f'{address}-none'}), 404, 'no address'),
        (api.call('POST', f'{q}/retry', {'ids': ['nope']}), 400, 'not a message id'),
        (api.call('DELETE', f'{q}/messages/0-1-1'), 404, 'no message'),
        (api.call('GET', '/subscriptions/nothing-here'), 404, 'no subscription'),
        (api.call('GET', '/queues', limit=5000), 400, 'limit'),
    ]
    for (status, body), want, says in cases:
        assert status == want, (body, want, says)
        assert says in body['error'], (body, says)
    assert numbers(broker, address, 2) == [0, 1]
