"""A large move killed (SIGKILL) while it runs loses no message, and the same move run again on
another replica finishes it without a duplicate: every message is counted afterwards. In every
store mode; on Redis Cluster the two queues live on different slots."""

import os
import signal
import threading
from typing import Any

import pytest
from mgmtapi import Api, quoted
from processes import BrokerProcess, wait_for
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from shoal_broker.store import connect, keys

COUNT = 30_000


class BulkSender(MessagingHandler):  # type: ignore[misc]
    """Sends ``count`` messages (property ``n``) as fast as credit allows; stops when all are
    accepted."""

    def __init__(self, url: str, address: str, count: int) -> None:
        super().__init__()
        self.url, self.address, self.count = url, address, count
        self.sent = self.accepted = 0

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url)
        event.container.create_sender(self.conn, self.address)

    def on_link_opened(self, event: Any) -> None:
        if not self.count:  # only to create the address
            event.connection.close()

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.count:
            event.sender.send(Message(body=f'm{self.sent}', properties={'n': self.sent}))
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == self.count:
            event.connection.close()


def numbers(api: Api, queue: str) -> list[int]:
    found: list[int] = []
    cursor = None
    while True:
        query: dict[str, Any] = {'limit': 500, **({'cursor': cursor} if cursor else {})}
        page = api.get(f'/queues/{quoted(queue)}/messages', **query)
        found += [m['application_properties']['n'] for m in page['messages']]
        cursor = page['next']
        if cursor is None:
            return found


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_move_killed_midway_loses_nothing_and_finishes_when_run_again(
    start_broker: Any, second_broker: BrokerProcess, store_url: str, address: str
) -> None:
    source, target = f'{address}-src', f'{address}-dst'
    mover = start_broker()
    bulk = BulkSender(mover.url, source, COUNT)
    Container(bulk).run()
    assert bulk.accepted == COUNT
    Container(BulkSender(mover.url, target, 0)).run()  # the target exists, empty
    api = Api(second_broker)
    wait_for(lambda: api.call('GET', f'/queues/{quoted(target)}')[0] == 200, 10, 'the target')
    answered: list[Any] = []

    def run_move() -> None:
        try:
            answered.append(
                Api(mover).call('POST', f'/queues/{quoted(source)}/move', {'target': target})
            )
        except OSError as exc:  # the replica was killed under the request
            answered.append(exc)

    move = threading.Thread(target=run_move, daemon=True)
    move.start()
    redis = connect.sync_client_of_any_mode(store_url)
    stream = keys.AddressKeys.of(target).streams[5]
    wait_for(lambda: redis.xlen(stream) > 0, 60, 'the move under way')
    os.kill(mover.pid, signal.SIGKILL)
    move.join(30)
    assert len(answered) == 1
    assert isinstance(answered[0], OSError), answered  # killed before it answered
    redis.close()
    left, arrived = numbers(api, source), numbers(api, target)
    assert left, 'the move finished before the kill: nothing was tested'
    assert set(left) | set(arrived) == set(range(COUNT))  # none lost
    assert len(set(left) & set(arrived)) <= 200  # at most the page being copied is in both
    done = api.post(f'/queues/{quoted(source)}/move', {'target': target})
    assert done['moved'] == len(left)
    assert numbers(api, source) == []
    assert sorted(numbers(api, target)) == list(range(COUNT))  # each exactly once
