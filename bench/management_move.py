"""
bench/management_move.py - how fast the management API moves, retries and browses messages.

usage: .venv/bin/python bench/management_move.py [--messages 20000] [--reps 3]

Starts a private redis-server and one broker on free loopback ports, fills a queue with
``--messages`` small messages through AMQP, then times through the API: a move of all of them
to another queue (and back, ``--reps`` times; median reported), and browsing them all in pages
of 500. Checks that every message arrived once, so a fast wrong answer does not pass. Results go
to docs/performance.md by hand.
"""

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'tests' / 'support'))

from mgmtapi import Api, quoted
from processes import BrokerProcess, RedisServer
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container


class Fill(MessagingHandler):  # type: ignore[misc]
    def __init__(self, url: str, address: str, count: int) -> None:
        super().__init__()
        self.url, self.address, self.count = url, address, count
        self.sent = self.accepted = 0

    def on_start(self, event: Any) -> None:
        event.container.create_sender(event.container.connect(self.url), self.address)

    def on_link_opened(self, event: Any) -> None:
        if not self.count:
            event.connection.close()

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.count:
            event.sender.send(Message(body=f'm{self.sent}', properties={'n': self.sent}))
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == self.count:
            event.connection.close()


def browse_all(api: Api, queue: str) -> int:
    seen, cursor = 0, None
    while True:
        query: dict[str, Any] = {'limit': 500, **({'cursor': cursor} if cursor else {})}
        page = api.get(f'/queues/{quoted(queue)}/messages', **query)
        seen += len(page['messages'])
        cursor = page['next']
        if cursor is None:
            return seen


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument('--messages', type=int, default=20_000)
    args.add_argument('--reps', type=int, default=3)
    opts = args.parse_args()
    redis = RedisServer()
    broker = BrokerProcess(redis.url)
    try:
        Container(Fill(broker.url, 'bench-a', opts.messages)).run()
        Container(Fill(broker.url, 'bench-b', 0)).run()
        api = Api(broker)
        moves = []
        for rep in range(opts.reps):
            source, target = ('bench-a', 'bench-b') if rep % 2 == 0 else ('bench-b', 'bench-a')
            started = time.perf_counter()
            done = api.post(f'/queues/{source}/move', {'target': target})
            moves.append(time.perf_counter() - started)
            assert done['moved'] == opts.messages, done
        started = time.perf_counter()
        where = 'bench-b' if opts.reps % 2 else 'bench-a'
        assert browse_all(api, where) == opts.messages
        browsed = time.perf_counter() - started
        move = statistics.median(moves)
        print(
            f'machine: {platform.machine()} {platform.processor() or ""}, '
            f'{platform.python_version()}'
        )
        print(
            f'move {opts.messages} messages: median {move:.2f} s '
            f'({opts.messages / move:,.0f} msg/s) over {opts.reps}'
        )
        print(f'browse {opts.messages} in pages of 500: {browsed:.2f} s '
              f'({opts.messages / browsed:,.0f} msg/s)')  # fmt: skip
    finally:
        broker.stop()
        redis.stop()


if __name__ == '__main__':
    main()
