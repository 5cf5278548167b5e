"""
The web console at ``/console`` in a real headless Chromium (Selenium), on real replicas and
Redis: log in with a user of the users file, retry a dead letter and receive it with a real
client, purge after a confirmation, browse with a selector, move by selector, pause and resume,
close a connection, and see every page drawn from the broker's own files with nothing fetched
elsewhere, no error logged and a message's markup shown as text. A screenshot of each page is
kept.
"""

import signal
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from amqpclient import Capabilities, connect, flush, receive_all, receiver, sender, settle
from consolebrowser import Console
from jmswire import JmsSource, durable_detach, subscriber
from mgmtapi import Api, quoted
from processes import LOOPBACK, BrokerProcess, wait_for
from proton import Delivery, Message
from proton.reactor import Container
from proton.utils import ConnectionClosed
from testusers import PASSWORDS, write_users

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

DLQ = f'console-dlq-{uuid.uuid4().hex[:6]}'


@pytest.fixture(scope='module')
def replicas(store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two replicas on one store, users file only (no ANONYMOUS), their own dead-letter queue."""
    users = write_users(tmp_path_factory.mktemp('users') / 'users.json')
    env = {
        'SHOAL_USERS_FILE': str(users), 'SHOAL_ALLOW_ANONYMOUS': 'false',
        'SHOAL_DEAD_LETTER_ADDRESS': DLQ,
    }  # fmt: skip
    a = BrokerProcess(store_url, env=env, replica_id=f'console-a-{uuid.uuid4().hex[:4]}')
    b = BrokerProcess(store_url, env=env, replica_id=f'console-b-{uuid.uuid4().hex[:4]}')
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture(scope='module')
def console(replicas: Any) -> Iterator[Console]:
    c = Console(f'http://{LOOPBACK}:{replicas[0].http_port}')
    c.open()
    c.login('carol', PASSWORDS['carol'])  # every permission
    c.find('#card-queues')
    yield c
    c.close()


def _connect(b: BrokerProcess) -> Any:
    return connect(b.url, user='carol', password=PASSWORDS['carol'], allowed_mechs='PLAIN')


def _fill(b: BrokerProcess, queue: str, count: int, **extra: Any) -> None:
    conn = _connect(b)
    snd = sender(conn, queue, Capabilities('queue'))
    for n in range(count):
        snd.send(Message(body=f'body-{n}', properties={'n': n, **extra}, subject=f's{n}'))
    conn.close()


def _api(b: BrokerProcess) -> Api:
    return Api(b, 'carol', PASSWORDS['carol'])


def _rows(console: Console) -> list[str]:
    return [str(r.get_attribute('data-id')) for r in console.all('#messages-table tr.message')]


def test_a_wrong_password_is_refused_and_the_right_one_lets_in(replicas: Any) -> None:
    c = Console(f'http://{LOOPBACK}:{replicas[1].http_port}')
    try:
        c.open('#/queues')
        c.find('#login-user')
        c.shot('login')
        c.login('carol', 'not-the-password')
        assert 'not accepted' in c.wait_text('#login-error', 'not accepted')
        c.login('bob', PASSWORDS['bob'])  # browse on orders.* only: sees no other queue
        assert c.find('#queues-table')
        assert c.text('#who') == 'User: bob'
    finally:
        c.close()


def test_retry_a_dead_letter_from_the_console_and_receive_it(
    replicas: Any, console: Console, address: str
) -> None:
    a, b = replicas
    _fill(a, address, 3)
    conn = _connect(b)
    rcv = receiver(conn, address, credit=3)
    for _ in range(3):
        rcv.receive(timeout=10)
        settle(rcv, Delivery.REJECTED)
    flush(conn)
    conn.close()
    api = _api(a)
    mine = "n = 1 AND JMSType = 's1'"

    def dead() -> int:  # the dead-letter queue exists from its first message
        status, page = api.call('GET', f'/queues/{quoted(DLQ)}/messages', selector=mine)
        return len(page['messages']) if status == 200 else 0

    wait_for(lambda: dead() == 1, 10, 'the dead letter n=1')
    console.open(f'#/queue/{quoted(DLQ)}')
    console.type('#selector', mine)
    console.click('#browse')
    console.wait(lambda: len(_rows(console)) == 1, 'the dead letter n=1 listed')
    (message_id,) = _rows(console)
    assert address in console.text(f'tr[data-id="{message_id}"]')  # its original address
    console.click(f'tr[data-id="{message_id}"] input.pick')
    console.shot('dead-letters')
    console.click('#retry')
    assert 'back to the address each was dead-lettered' in console.confirm(ok=True)
    assert '1 moved' in console.wait_text('#notice', 'moved')
    assert f'{address}: 1' in console.text('#notice')
    console.shot('dead-letter-retried')
    conn = _connect(b)  # a real client receives it again from its original queue
    got = receive_all(receiver(conn, address, credit=1), 1)
    assert [(m.properties['n'], m.body) for m in got] == [(1, 'body-1')]
    conn.close()
    left = api.get(f'/queues/{quoted(DLQ)}/messages', selector='n <> 1', limit=500)['messages']
    original = [m['annotations'].get('x-opt-shoal-original-address') for m in left]
    assert original.count(address) == 2  # the other two wait on


def test_purge_asks_first_and_a_cancel_keeps_every_message(
    replicas: Any, console: Console, address: str
) -> None:
    a, _ = replicas
    _fill(a, address, 5)
    api = _api(a)
    console.open(f'#/queue/{quoted(address)}')
    console.wait_text('#backlog', '5')
    console.click('#purge')
    assert '5 messages' in console.text('#confirm-text')
    console.shot('purge-confirmation')
    console.confirm(ok=False)
    assert api.get(f'/queues/{quoted(address)}')['backlog'] == 5  # cancelled: nothing gone
    console.click('#purge')
    console.confirm(ok=True)
    assert 'Purged 5 message(s)' in console.wait_text('#notice', 'Purged')
    console.wait_text('#backlog', '0')
    console.wait(lambda: not _rows(console), 'an empty browser')
    console.shot('purged')
    assert api.get(f'/queues/{quoted(address)}')['backlog'] == 0
    _fill(a, address, 1)  # the queue works on
    conn = _connect(a)
    assert [m.body for m in receive_all(receiver(conn, address, credit=1), 1)] == ['body-0']
    conn.close()


def test_browse_with_a_selector_pages_and_a_bad_selector_is_told(
    replicas: Any, console: Console, address: str
) -> None:
    a, _ = replicas
    conn = _connect(a)
    snd = sender(conn, address, Capabilities('queue'))
    for n in range(30):
        region = 'eu' if n % 3 == 0 else 'us'
        snd.send(Message(body=f'order {n}', properties={'n': n, 'region': region}))
    conn.close()
    console.open(f'#/queue/{quoted(address)}')
    console.wait(lambda: len(_rows(console)) == 30, 'every message listed')
    console.type('#selector', "region = 'eu' AND n >= 6")
    console.click('#browse')
    console.wait(lambda: len(_rows(console)) == 8, 'the 8 matches')  # 6, 9, ..., 27
    shown = [r.text for r in console.all('#messages-table tr.message')]
    assert all('region="eu"' in t for t in shown), shown
    assert 'order 27' in shown[-1]
    console.find('#messages-table tr.message a.open').click()  # open the first one
    detail = console.text('#messages-table tr.detail pre')
    assert '"n": 6' in detail
    assert '"delivery_count": 0' in detail
    console.shot('browse-selector')
    console.choose('#browse-size', '20')
    console.type('#selector', 'n < 25')
    console.click('#browse')
    console.wait(lambda: len(_rows(console)) == 20, 'a first page of 20')
    console.click('#browse-next')
    console.wait_text('#browse-range', 'Page 2')
    console.wait(lambda: len(_rows(console)) == 5, 'the second page: 5 more')
    console.type('#selector', 'region = ')
    console.click('#browse')
    assert 'selector' in console.wait_text('#notice', 'selector').lower()
    conn = _connect(a)  # browsing consumed nothing
    assert len(receive_all(receiver(conn, address, credit=30), 30)) == 30
    conn.close()


def test_every_page_draws_from_the_broker_alone(replicas: Any, console: Console) -> None:
    a, b = replicas
    topic = f'news.console-{uuid.uuid4().hex[:6]}'
    name = f'audit-{uuid.uuid4().hex[:6]}'
    conn = _connect(b)
    rcv = subscriber(conn, topic, f'{name}|global',
                     JmsSource('topic', 'shared', 'global', durable=True), credit=0)  # fmt: skip
    markup = '<img src=x onerror="window.pwned = 1">'  # shown as text, never run
    sender(conn, topic, Capabilities('topic')).send(
        Message(body=markup, properties={'n': 1, 'note': markup})
    )
    flush(conn)
    pages = {
        'overview': ('#/overview', '#card-backlog'),
        'queues': ('#/queues', '#queues-table'),
        'subscriptions': (f'#/subscriptions?search={name}', '#subscriptions-table tbody tr'),
        'subscription': (f'#/subscription/{quoted("durable:global:*:" + name)}',
                         '#messages-table tr.message'),
        'connections': ('#/connections', '#connections-table'),
    }  # fmt: skip
    console.errors()  # what earlier tests' pages logged (their refused requests) is theirs
    for page, (route, shown) in pages.items():
        console.open(route)
        console.find(shown)
        console.shot(page)
        assert console.errors() == [], page
    console.open(pages['subscription'][0])
    assert markup in console.text('#messages-table tr.message')
    assert console.all('#messages-table img') == []
    assert console.driver.execute_script('return window.pwned') is None
    console.open(pages['subscriptions'][0])
    row = console.text('#subscriptions-table tbody tr')
    assert topic in row
    assert f'{b.replica_id}: 1' in row
    console.open('#/connections')
    assert b.replica_id in console.text('#connections-table')
    origin = f'http://{LOOPBACK}:{a.http_port}'
    assert all(url.startswith(origin) for url in console.requests()), console.requests()
    with urllib.request.urlopen(f'{origin}/console', timeout=10) as page:
        assert urlsplit(page.url).path == '/console/'  # redirected to the console's index
        assert "script-src 'self'" in page.headers['Content-Security-Policy']
        assert b'type="module" src="app.js"' in page.read()
    durable_detach(rcv)
    conn.close()


def test_close_a_connection_from_the_console(replicas: Any, console: Console, address: str) -> None:
    _, b = replicas
    container = Container()
    container.container_id = f'console-victim-{uuid.uuid4().hex[:8]}'
    conn = connect(b.url, user='carol', password=PASSWORDS['carol'], allowed_mechs='PLAIN',
                   container=container)  # fmt: skip
    rcv = receiver(conn, address, credit=1)
    row = f'#connections-table tr[data-container="{container.container_id}"]'

    def listed() -> bool:  # a replica lists its connections every second: open the page again
        console.open('#/connections')
        console.find('#connections-table')
        return console.visible(row) is not None

    wait_for(listed, 15, 'the connection listed')
    assert b.replica_id in console.text(row)
    console.click(f'{row} button')
    assert f'on replica {b.replica_id}' in console.confirm(ok=True)
    console.wait_text('#notice', 'Closing connection')
    closed: list[str] = []

    def gone() -> bool:
        try:
            flush(conn)
            rcv.receive(timeout=0.2)
        except ConnectionClosed as exc:
            closed.append(str(exc))
            return True
        except Exception:
            return False
        return False

    wait_for(gone, 10, 'the connection closed')
    assert 'forced' in closed[0]


def test_move_by_selector_and_pause_from_the_console(
    replicas: Any, console: Console, address: str
) -> None:
    a, b = replicas
    target = f'{address}-moved'
    _fill(a, address, 6)
    _fill(a, target, 0)  # the target exists (a move to an unknown address is refused)
    api = _api(a)
    console.open(f'#/queue/{quoted(address)}')
    console.wait(lambda: len(_rows(console)) == 6, 'every message listed')
    console.type('#selector', 'n >= 4')
    console.type('#move-target', target)
    console.click('#move')
    assert f'every message matching n >= 4 of {address} to {target}' in console.confirm(ok=True)
    assert '2 moved' in console.wait_text('#notice', 'moved')
    console.wait(lambda: not _rows(console), 'no match left')  # the browser reads again
    console.click('#pause')
    console.wait_text('#pause', 'Resume delivery')
    assert api.get(f'/queues/{quoted(address)}')['paused'] is True
    console.shot('queue-paused')
    console.click('#pause')
    console.wait_text('#pause', 'Pause delivery')
    assert api.get(f'/queues/{quoted(address)}')['paused'] is False
    conn = _connect(b)
    moved = receive_all(receiver(conn, target, credit=2), 2)
    assert sorted(m.properties['n'] for m in moved) == [4, 5]
    kept = receive_all(receiver(conn, address, credit=4), 4)
    assert sorted(m.properties['n'] for m in kept) == [0, 1, 2, 3]
    conn.close()


def test_the_console_names_a_replica_that_has_not_applied_a_pause(
    replicas: Any, console: Console, address: str
) -> None:
    a, b = replicas
    _fill(a, address, 1)
    console.open(f'#/queue/{quoted(address)}')
    console.wait_text('#pause', 'Pause delivery')
    b.process.send_signal(signal.SIGSTOP)  # alive, but not looking at its commands
    try:
        console.click('#pause')
        said = console.wait_text('#notice', 'not yet applied')
    finally:
        b.process.send_signal(signal.SIGCONT)
    assert b.replica_id in said
    assert a.replica_id not in said
    console.wait_text('#pause', 'Resume delivery')
    console.shot('queue-pause-unconfirmed')
    _api(a).post(f'/queues/{quoted(address)}/resume')
