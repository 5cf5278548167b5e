"""
``make run`` in one terminal, ``shoal queues`` in another: the command finds the broker's embedded
Redis with no flag and no SHOAL_REDIS_URL, from the directory ``make run`` ran in (the broker's
data directory) or from anywhere through ``$XDG_RUNTIME_DIR``; when it finds nothing it says where
it looked. The broker is started with the very command line ``make run`` runs.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from amqpclient import connect, send_all
from processes import LOOPBACK, free_port, stop, wait_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DISCOVERY_FILE = Path('.data') / 'redis' / 'shoal-redis.json'
UNSET = ('SHOAL_REDIS_URL', 'SHOAL_DATA_DIR', 'XDG_RUNTIME_DIR', 'REDIS_URL')


def make_run_command(port: int, http_port: int) -> list[str]:
    """The broker command ``make run`` runs (its recipe, printed by ``make -n``)."""
    dry = subprocess.run(
        ['make', '-n', '--no-print-directory', 'run', f'PORT={port}', f'HTTP_PORT={http_port}',
         'REDIS_URL='],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    recipe = dry.stdout.replace('\\\n', ' ')  # the recipe's continued lines, joined
    [line] = [line for line in recipe.splitlines() if 'shoal-broker' in line]
    args = shlex.split(line)
    assert args[0] == '.venv/bin/shoal-broker', line
    assert '--redis-url' not in args
    return [str(BIN / 'shoal-broker'), *args[1:]]


def clean_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in UNSET}, **extra}


def shoal(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / 'shoal'), *args], cwd=cwd, env=clean_env(**env),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def make_run(tmp_path: Path) -> Iterator[tuple[Path, Path, int]]:
    """``make run``'s broker in a fresh working directory: (that directory, the broker's
    $XDG_RUNTIME_DIR, its AMQP port)."""
    workdir, runtime = tmp_path / 'project', tmp_path / 'runtime'
    workdir.mkdir()
    runtime.mkdir(mode=0o700)
    port, http_port = free_port(), free_port()
    command = make_run_command(port, http_port)
    log = (tmp_path / 'broker.log').open('wb')
    process = subprocess.Popen(
        command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
        env=clean_env(XDG_RUNTIME_DIR=str(runtime)),
    )  # fmt: skip

    def ready() -> bool:
        assert process.poll() is None, (tmp_path / 'broker.log').read_text()
        try:
            with urllib.request.urlopen(f'http://{LOOPBACK}:{http_port}/readyz', timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        wait_for(ready, 30, 'the make run broker')
        yield workdir, runtime, port
    finally:
        stop(process)
        log.close()


def test_shoal_finds_the_broker_make_run_started_without_a_flag(
    make_run: tuple[Path, Path, int], tmp_path: Path, address: str
) -> None:
    workdir, runtime, port = make_run
    conn = connect(f'amqp://{LOOPBACK}:{port}')
    send_all(conn, address, ['one', 'two'])
    conn.close()
    # from the directory make run ran in
    listed = shoal('queues', cwd=workdir)
    assert listed.returncode == 0, listed.stderr
    [row] = [line.split() for line in listed.stdout.splitlines() if line.startswith(address)]
    assert row[:2] == [address, '2']  # its name and backlog
    # from anywhere else, through the runtime directory
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    found = shoal('queues', '--json', cwd=elsewhere, XDG_RUNTIME_DIR=str(runtime))
    assert found.returncode == 0, found.stderr
    assert address in [q['name'] for q in json.loads(found.stdout)]
    # the announcement names a private socket, readable by the user alone
    announced = workdir / DISCOVERY_FILE
    assert json.loads(announced.read_text())['url'].startswith('unix://')
    assert announced.stat().st_mode & 0o077 == 0
    # an explicit URL still wins: a wrong one is not replaced by the one found
    wrong = shoal('--redis-url', f'redis://{LOOPBACK}:{free_port()}/0', 'queues', cwd=workdir)
    assert wrong.returncode == 1


def test_once_the_broker_stops_shoal_says_where_it_looked(
    make_run: tuple[Path, Path, int], tmp_path: Path
) -> None:
    workdir, runtime, _ = make_run
    announced = workdir / DISCOVERY_FILE
    assert announced.exists()
    assert list(runtime.glob('shoal/*.json'))
    pid = json.loads(announced.read_text())['pid']
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not announced.exists(), 30, 'the announcement to be withdrawn')
    assert not list(runtime.glob('shoal/*.json'))
    nothing = shoal('queues', cwd=workdir, XDG_RUNTIME_DIR=str(runtime))
    assert nothing.returncode == 2
    assert 'pass --redis-url or set SHOAL_REDIS_URL' in nothing.stderr
    assert f'{DISCOVERY_FILE} (absent)' in nothing.stderr
    assert f'{runtime / "shoal"} (no running broker)' in nothing.stderr
    # a broker killed with SIGKILL leaves its file behind: its pid is gone, so it is not taken
    gone = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'],
                          capture_output=True, text=True, check=True, timeout=30)  # fmt: skip
    announced.write_text(json.dumps({'url': 'unix:///nowhere/redis.sock', 'pid': int(gone.stdout)}))
    stale = shoal('queues', cwd=workdir)
    assert stale.returncode == 2
    assert f'its broker, pid {int(gone.stdout)}, is gone' in stale.stderr
    assert '$XDG_RUNTIME_DIR (not set)' in stale.stderr
    # several brokers announced in the runtime directory: shoal does not guess
    (runtime / 'shoal').mkdir(exist_ok=True)
    for pid in (os.getpid(), os.getppid()):  # two live processes
        (runtime / 'shoal' / f'{pid}.json').write_text(
            json.dumps({'url': 'unix:///nowhere/redis.sock', 'pid': pid})
        )
    several = shoal('queues', cwd=tmp_path, XDG_RUNTIME_DIR=str(runtime))
    assert several.returncode == 2
    assert '(2 brokers run, pids' in several.stderr
