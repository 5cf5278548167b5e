"""Who may use the management API: the users file and permissions of AMQP, over HTTP Basic;
every write an audit line and a counted metric."""

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from amqpclient import Capabilities, connect, sender
from exposition import samples
from mgmtapi import Api, quoted
from processes import BrokerProcess
from proton import Message, symbol
from testusers import PASSWORDS, write_users


@pytest.fixture(scope='module')
def secure_broker(store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    users = write_users(tmp_path_factory.mktemp('users') / 'users.json')
    b = BrokerProcess(
        store_url, env={'SHOAL_USERS_FILE': str(users), 'SHOAL_ALLOW_ANONYMOUS': 'false'}
    )
    yield b
    b.stop()


def _as(b: BrokerProcess, user: str | None, password: str | None = None) -> Api:
    return Api(b, user, PASSWORDS.get(user or '', '') if password is None else password)


def test_reads_need_browse_and_writes_need_manage(secure_broker: BrokerProcess) -> None:
    queue = 'orders.mgmt'
    conn = connect(
        secure_broker.url, user='carol', password=PASSWORDS['carol'], allowed_mechs='PLAIN'
    )
    sender(conn, queue, Capabilities('queue')).send(Message(body='one'))
    conn.close()
    q = f'/queues/{quoted(queue)}'
    nobody, wrong = _as(secure_broker, None), _as(secure_broker, 'bob', 'not-it')
    bob, alice, carol = (_as(secure_broker, u) for u in ('bob', 'alice', 'carol'))
    status, said = nobody.call('GET', '/queues')
    assert status == 401, said  # ANONYMOUS is off
    assert wrong.call('GET', '/queues')[0] == 401
    assert len(bob.get(f'{q}/messages')['messages']) == 1  # browse on orders.*
    assert alice.call('GET', f'{q}/messages')[0] == 200  # consume implies browse
    status, said = bob.call('POST', f'{q}/purge')
    assert status == 403, said
    assert bob.call('GET', '/connections')[0] == 403  # broker-wide: browse on '*'
    assert carol.post(f'{q}/purge') == {'purged': 1, 'in_flight': 0}
    log = secure_broker.log()
    assert f'audit user=bob operation=POST:/api{q}/purge target={queue} outcome=denied' in log
    assert f'audit user=carol operation=purge target={queue} outcome=ok' in log
    found = samples(secure_broker)
    ok = ('shoal_management_writes_total', (('operation', 'purge'), ('outcome', 'ok')))
    assert found[ok] >= 1


def test_anonymous_only_where_the_broker_offers_it(broker: BrokerProcess) -> None:
    assert Api(broker).call('GET', '/queues')[0] == 200  # the test broker offers ANONYMOUS
    assert Api(broker, 'nobody', 'x').call('GET', '/queues')[0] == 401  # no users file


def test_the_openapi_document_needs_no_credentials(secure_broker: BrokerProcess) -> None:
    status, doc = _as(secure_broker, None).call('GET', '/openapi.json')
    assert status == 200
    assert doc['openapi'].startswith('3.')
    assert '/queues/{name}/move' in doc['paths']


def test_the_operators_management_credentials_work_on_the_api_only(
    start_broker: Any, tmp_path: Path, address: str
) -> None:
    (tmp_path / 'username').write_text('shoal-admin\n')
    (tmp_path / 'password').write_text('s3cret-from-the-operator')
    b = start_broker(env={
        'SHOAL_ALLOW_ANONYMOUS': 'false', 'SHOAL_MANAGEMENT_CREDENTIALS_DIR': str(tmp_path),
    })  # fmt: skip
    admin = Api(b, 'shoal-admin', 's3cret-from-the-operator')
    assert admin.call('GET', '/queues')[0] == 200
    assert admin.call('POST', f'/queues/{quoted(address)}/purge')[0] == 404  # let in, no queue
    assert Api(b, 'shoal-admin', 'guess').call('GET', '/queues')[0] == 401
    (tmp_path / 'password').write_text('rotated')  # a Secret update applies at once
    assert Api(b, 'shoal-admin', 'rotated').call('GET', '/queues')[0] == 200
    assert admin.call('GET', '/queues')[0] == 401


def test_a_retry_moves_only_to_addresses_the_caller_may_manage(
    secure_broker: BrokerProcess,
) -> None:
    dlq, original = f'news.dlq-{uuid.uuid4().hex[:6]}', f'orders.retry-{uuid.uuid4().hex[:6]}'
    conn = connect(
        secure_broker.url, user='carol', password=PASSWORDS['carol'], allowed_mechs='PLAIN'
    )
    sender(conn, original, Capabilities('queue'))  # the original queue exists
    dead = Message(body='dead', annotations={symbol('x-opt-shoal-original-address'): original})
    sender(conn, dlq, Capabilities('queue')).send(dead)
    conn.close()
    alice, carol = _as(secure_broker, 'alice'), _as(secure_broker, 'carol')
    refused = alice.post(f'/queues/{quoted(dlq)}/retry')  # manage on news.*, not orders.*
    assert (refused['moved'], refused['denied']) == (0, 1)
    done = carol.post(f'/queues/{quoted(dlq)}/retry')
    assert (done['moved'], done['targets']) == (1, {original: 1})
