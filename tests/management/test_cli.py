"""``shoal`` runs the management operations through a real broker's API."""

import json
import subprocess
import sys
from typing import Any

from amqpclient import Capabilities, connect, sender
from mgmtapi import Api, quoted
from processes import LOOPBACK, BrokerProcess
from proton import Message


def shoal(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, '-m', 'shoal_broker.admin', '--api-url',
         f'http://{LOOPBACK}:{broker.http_port}/api', *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_browse_move_and_purge_from_the_command_line(broker: BrokerProcess, address: str) -> None:
    source, target = f'{address}-src', f'{address}-dst'
    conn = connect(broker.url)
    for queue, count in ((source, 4), (target, 0)):
        snd = sender(conn, queue, Capabilities('queue'))
        for n in range(count):
            snd.send(Message(body=f'b{n}', properties={'n': n}))
    conn.close()
    browsed = shoal(broker, 'browse', source, '--selector', 'n < 2')
    assert browsed.returncode == 0, browsed.stderr
    shown: dict[str, Any] = json.loads(browsed.stdout)
    assert [m['application_properties']['n'] for m in shown['messages']] == [0, 1]
    moved = shoal(broker, 'move', source, target, '--selector', 'n >= 2')
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout)['moved'] == 2
    purged = shoal(broker, 'purge', source)
    assert json.loads(purged.stdout) == {'purged': 2, 'in_flight': 0}
    assert Api(broker).get(f'/queues/{quoted(target)}')['backlog'] == 2
    refused = shoal(broker, 'purge', f'{address}-none')
    assert refused.returncode == 1
    assert '404' in refused.stderr
