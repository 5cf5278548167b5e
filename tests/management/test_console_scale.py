"""
The web console at ten thousand queues (a Redis of this module's own, the shared one must not
hold them): the queue list is paged, searched and sorted by the API, so the browser holds one
page at a time; screenshots of the list and the overview are kept.
"""

import asyncio
from collections.abc import Iterator

import pytest
from amqpclient import Capabilities, connect, sender
from consolebrowser import Console
from mgmtapi import Api
from processes import LOOPBACK, BrokerProcess, RedisServer
from proton import Message

from shoal_broker.routing.storage import AddressKind
from shoal_broker.store.redisstore import RedisStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

QUEUES = 10_000
FILLED = {'q-07000': 3, 'q-05000': 1, 'q-06000': 1}
"""The only queues holding messages: largest backlog first, then by name."""
DASH = '\u2013'
"""The pager's range: 1\u201350 of 10,000."""


async def _create_queues(url: str, count: int) -> None:
    """Declared through the store as a first attach declares them, 500 at a time."""
    store = RedisStore.from_url(url, 'test-setup')
    await store.start()
    try:
        for start in range(0, count, 500):
            await asyncio.gather(*(
                store.registry.create_address(f'q-{n:05d}', AddressKind.QUEUE)
                for n in range(start, min(count, start + 500))
            ))  # fmt: skip
    finally:
        await store.close()


@pytest.fixture(scope='module')
def crowded() -> Iterator[BrokerProcess]:
    server = RedisServer()
    try:
        asyncio.run(_create_queues(server.url, QUEUES))
        broker = BrokerProcess(server.url, replica_id='crowded')  # ANONYMOUS: no log-in
        try:
            conn = connect(broker.url)
            for name, count in FILLED.items():
                snd = sender(conn, name, Capabilities('queue'))
                for n in range(count):
                    snd.send(Message(body=n))
            conn.close()
            yield broker
        finally:
            broker.stop()
    finally:
        server.stop()


def _names(console: Console) -> list[str]:
    return console.attributes('#queues-table tbody tr', 'data-name')


def test_ten_thousand_queues_page_and_search(crowded: BrokerProcess) -> None:
    console = Console(f'http://{LOOPBACK}:{crowded.http_port}')
    try:
        console.open('#/queues')
        assert console.wait_text('#pager .range', 'of 10,000') == f'1{DASH}50 of 10,000'
        assert _names(console) == [f'q-{n:05d}' for n in range(50)]
        console.shot('queues-10000')
        console.click('#pager [data-page=next]')
        console.wait_text('#pager .range', f'51{DASH}100 of 10,000')
        assert _names(console)[0] == 'q-00050'
        console.click('#pager [data-page=last]')
        console.wait_text('#pager .range', f'9,951{DASH}10,000 of 10,000')
        assert _names(console)[-1] == 'q-09999'
        assert console.find('#pager [data-page=next]').get_attribute('disabled') is not None
        console.choose('#page-size', '500')
        console.wait_text('#pager .range', f'1{DASH}500 of 10,000')
        console.wait(lambda: len(_names(console)) == 500, 'a page of 500')
        console.type('#search', 'q-0999')  # the list follows the typing
        console.wait_text('#pager .range', f'1{DASH}10 of 10')
        assert _names(console) == [f'q-{n:05d}' for n in range(9990, 10_000)]
        console.shot('queues-10000-search')
        console.type('#search', 'no-such-queue')
        console.wait_text('#pager .range', 'none')
        console.type('#search', '')
        console.choose('#sort', 'backlog')
        console.wait(lambda: _names(console)[:3] == list(FILLED), 'largest backlog first')
        console.shot('queues-10000-by-backlog')
        console.open('#/overview')
        assert console.wait_text('#card-queues', '10,000').startswith('10,000')
        busiest = [r.text.split()[0] for r in console.all('#busiest-table tbody tr')]
        assert busiest == list(FILLED)
        assert console.text('#card-backlog').split()[0] == '5'  # every message, page or not
        console.shot('overview-10000')
    finally:
        console.close()


def test_a_listing_sorts_by_backlog_across_every_page(crowded: BrokerProcess) -> None:
    api = Api(crowded)
    first = api.get('/queues', sort='backlog', limit=3)
    assert first['total'] == QUEUES
    assert [(q['name'], q['backlog']) for q in first['items']] == list(FILLED.items())
    after = api.get('/queues', sort='backlog', offset=3, limit=2)['items']
    assert [q['name'] for q in after] == ['q-00000', 'q-00001']  # the empty ones by name
    assert api.get('/queues', sort='name', limit=1)['items'][0]['name'] == 'q-00000'
    status, refused = api.call('GET', '/queues', sort='size')
    assert status == 400, refused
    assert 'sort must be one of' in refused['error']
    assert api.call('GET', '/subscriptions', sort='backlog')[1]['total'] == 0
