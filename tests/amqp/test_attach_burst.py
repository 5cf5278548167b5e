"""
A burst of consumer attaches to new queues, hundreds at once on one connection, is served in
turn and never refused: each attach makes a few cold-path Redis calls, so the burst asks for far
more connections at once than the store's pool holds. On a standalone Redis the pool makes the
calls wait; on Redis Cluster redis-py's client refused every call past a node's pool at once,
and the broker refused most of such a burst with ``amqp:resource-limit-exceeded`` ("Redis
unreachable"). The bench's load generator (bench/load.py) makes the burst: one consumer link
from each of the queues, then one message through each.
"""

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from exposition import samples
from processes import BrokerProcess

LOAD = Path(__file__).resolve().parents[2] / 'bench' / 'load.py'
QUEUES = 400


@pytest.mark.timeout(120)
def test_hundreds_of_attaches_at_once_are_all_served(
    start_broker: Callable[..., BrokerProcess], address: str, tmp_path: Path
) -> None:
    broker = start_broker(env={'SHOAL_MAX_AUTO_CREATED_ADDRESSES_PER_USER': '0'})
    out = tmp_path / 'row.jsonl'
    done = subprocess.run(
        [sys.executable, str(LOAD), 'run', '--port', str(broker.port), '--json', str(out),
         '--label', 'burst', '-a', address, '--addresses', str(QUEUES), '-n', str(QUEUES),
         '--max-backlog', str(QUEUES), '--timeout', '60'],
        capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    rep = json.loads(out.read_text().splitlines()[-1])['reps'][0]
    refused = {
        labels: count
        for (name, labels), count in samples(broker).items()
        if name == 'shoal_links_refused_total' and count
    }
    assert refused == {}
    assert (done.returncode, rep['complete'], rep['missing'], rep['errors']) == (0, True, 0, [])
