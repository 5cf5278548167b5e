"""
The scale matrix's row g accounting (bench/shards.py): what two samples of a cluster's nodes and
a run's own result make of one run, how the table takes medians over complete runs only, and a
malformed sample refused with a reason.
"""

import json
import subprocess
import sys
from pathlib import Path

SHARDS = Path(__file__).resolve().parents[2] / 'bench' / 'shards.py'

BEFORE = '1.0 100 0 0 0 10\n2.0 200 0 0 0 20\n'
"""Two nodes: CPU seconds, commands, MOVED, ASK, CROSSSLOT, keys."""
AFTER = '1.5 900 1 0 0 30\n2.25 400 0 0 0 40\n'


def shards(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SHARDS), *args], capture_output=True, text=True, timeout=30,
        check=False,
    )  # fmt: skip


def report(path: Path, skip: int, part: str, *, before: str = BEFORE) -> None:
    done = shards(
        'report', '--json', str(path), '--skip', str(skip), '--label', part, '--part', part,
        '--shards', '2', '--messages', '1000', '--before', before, '--after', AFTER,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_a_run_is_costed_per_shard(tmp_path: Path) -> None:
    results = tmp_path / 'matrix.jsonl'
    run = {'median': {'msgs_per_s': 5000.0, 'broker_us_per_msg': 40.0, 'p99_ms': 2.5},
           'reps': [{'errors': [], 'missing': 0}]}  # fmt: skip
    results.write_text(json.dumps(run) + '\n')
    report(results, 0, 'a saturation')
    record = json.loads(results.read_text().splitlines()[-1])
    assert record['row'] == 'g'
    assert (record['msg_per_s'], record['broker_us_per_msg'], record['complete']) == (
        5000.0, 40.0, True
    )  # fmt: skip
    assert record['redis_us_per_msg'] == 750.0  # 0.75 CPU s over 1 000 messages
    assert record['redis_us_per_msg_per_shard'] == [500.0, 250.0]
    assert record['redis_cpu_share_pct'] == [66.7, 33.3]
    assert record['commands_per_msg'] == 1.0
    assert record['commands_share_pct'] == [80.0, 20.0]
    assert (record['moved'], record['ask'], record['crossslot']) == (1, 0, 0)
    assert record['keys'] == [30, 40]


def test_the_table_leaves_out_a_run_cut_short(tmp_path: Path) -> None:
    results = tmp_path / 'matrix.jsonl'
    run = {'msg_per_s': 900, 'broker_us_per_msg': 30.0, 'p99_ms': 4.0, 'missing': 0}
    results.write_text(json.dumps(run) + '\n')
    report(results, 0, 'f queue')
    lines = len(results.read_text().splitlines())
    report(results, lines, 'f queue')  # the run wrote nothing: cut short
    table = shards('table', str(results))
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith('| f queue'))
    cells = [cell.strip() for cell in row.strip('|').split('|')]
    assert cells[:4] == ['f queue', '2', '1 (1 cut short)', '900']
    assert cells[7:10] == ['500.0/250.0', '67/33', '1.33']


def test_a_malformed_sample_is_refused_with_a_reason(tmp_path: Path) -> None:
    results = tmp_path / 'matrix.jsonl'
    done = shards(
        'report', '--json', str(results), '--label', 'x', '--part', 'x', '--shards', '2',
        '--messages', '1000', '--before', '1.0 100\n', '--after', AFTER,
    )  # fmt: skip
    assert done.returncode != 0
    assert 'a node sample has 2 fields, not 6' in done.stderr
    assert not results.exists()
