"""
The benchmark kit's load generator (bench/load.py) against a real broker: each row shape it
measures completes with every message counted once, and a row that loses messages is reported
as such, so ``make bench`` cannot pass on a broken broker or a broken client.
"""

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from exposition import samples, value
from processes import BrokerProcess

LOAD = Path(__file__).resolve().parents[2] / 'bench' / 'load.py'


def run_row(broker: BrokerProcess, tmp_path: Path, *options: str) -> tuple[int, dict[str, Any]]:
    """One row, one repetition: the exit status and the row's JSON record."""
    out = tmp_path / 'row.jsonl'
    done = subprocess.run(
        [sys.executable, str(LOAD), 'run', '--port', str(broker.port), '--json', str(out),
         '--label', 'test', *options],
        capture_output=True, text=True, timeout=50, check=False,
    )  # fmt: skip
    record: dict[str, Any] = json.loads(out.read_text().splitlines()[-1])
    return done.returncode, record


@pytest.mark.parametrize(
    'options',
    [
        ('-n', '2000', '--max-backlog', '500'),
        ('-n', '2000', '--max-backlog', '500', '--presettled'),
        ('-n', '2000', '--max-backlog', '500', '-k', '3'),
        ('-n', '300', '--rate', '1000'),
    ],
    ids=['at-least-once', 'presettled', 'competing', 'rate'],
)
def test_rows_count_every_message_once(
    broker: BrokerProcess, address: str, tmp_path: Path, options: tuple[str, ...]
) -> None:
    status, record = run_row(broker, tmp_path, '-a', address + '-{run}', *options)
    rep = record['reps'][0]
    assert (status, rep['complete'], rep['missing'], rep['duplicates'], rep['errors']) == (
        0, True, 0, 0, []
    )  # fmt: skip
    assert rep['deliveries'] == rep['count']
    assert rep['p50_ms'] is not None
    assert rep['broker_cpu_s'] is None  # no --broker-pid given


def test_a_row_spread_over_addresses_sends_to_each_in_turn(
    broker: BrokerProcess, address: str, tmp_path: Path
) -> None:
    """--addresses 4: one link per address at each end, the messages dealt out evenly."""
    status, record = run_row(
        broker, tmp_path, '-a', address, '-n', '2000', '--max-backlog', '500', '--addresses', '4'
    )
    rep = record['reps'][0]
    assert (status, rep['complete'], rep['missing'], rep['duplicates']) == (0, True, 0, 0)
    names = [f'{address}-{i}' for i in range(4)]
    assert rep['addresses'] == names
    found = samples(broker)
    assert [value(found, 'shoal_messages_enqueued_total', address=n) for n in names] == [500] * 4


def test_fan_out_reaches_every_subscriber(
    start_broker: Callable[..., BrokerProcess], address: str, tmp_path: Path
) -> None:
    topics = start_broker(env={'SHOAL_DEFAULT_ADDRESS_KIND': 'topic'})
    status, record = run_row(
        topics, tmp_path, '-a', address + '-{run}', '-n', '500', '--max-backlog', '200',
        '-k', '3', '--fanout', '--broker-pid', str(topics.pid),
    )  # fmt: skip
    rep = record['reps'][0]
    assert (status, rep['complete'], rep['missing'], rep['duplicates']) == (0, True, 0, 0)
    assert rep['deliveries'] == 1500
    assert rep['broker_us_per_msg'] > 0


def test_a_row_that_loses_messages_fails(
    broker: BrokerProcess, address: str, tmp_path: Path
) -> None:
    """Fan-out against a queue: the three "subscribers" compete, so each misses two thirds."""
    status, record = run_row(
        broker, tmp_path, '-a', address + '-{run}', '-n', '300', '-k', '3', '--fanout',
        '--timeout', '3',
    )  # fmt: skip
    rep = record['reps'][0]
    assert status == 1
    assert not rep['complete']
    assert rep['missing'] == 600
    assert rep['deliveries'] == 300
    assert record['median']['complete_reps'] == 0
