"""Real processes for tests: a redis-server and broker replicas on free loopback ports."""

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import redis
import redis.backoff
import redis.retry

LOOPBACK = '127.0.0.1'

ONE_ATTEMPT = redis.retry.Retry(redis.backoff.NoBackoff(), 0)
"""A client's retry policy for a watch: one attempt per command. redis-py's default tries a
refused connection ten times more with a growing pause (~4 s in all), so a watch polling a
killed Redis blocked through the outage and, the node back by then, saw none."""

LOG_DIR = Path(tempfile.mkdtemp(prefix='shoal-test-logs-'))
"""Every broker's log of this test run, removed when the run ends (tests/conftest.py): one
file per broker started, a few hundred a run, used to pile up in /tmp."""


QUICK_REPLICATION = ('--repl-diskless-sync-delay', '0')
"""A replica's full sync starts at once: by default a primary waits five seconds for more
replicas to share the transfer with, which every replica started or restarted in a test (a
Sentinel group's, a failed-over or killed node's) would sit through."""


def _ephemeral_low() -> int:
    try:
        return int(Path('/proc/sys/net/ipv4/ip_local_port_range').read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_share(ports: range) -> range:
    """This pytest-xdist worker's share of ``ports`` (every ``count``-th one from its index): the
    workers are processes of their own, and two that picked the same free port before either
    server bound it started two servers on it (a broker's readiness probe once read another
    worker's broker's AMQP header)."""
    worker = os.environ.get('PYTEST_XDIST_WORKER', '')
    count = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1') or 1)
    if not worker.startswith('gw') or count < 2:
        return ports
    return ports[int(worker[2:]) % count :: count]


_LISTEN_PORTS = _worker_share(range(10000, min(_ephemeral_low(), 32768)))
"""Where servers of a test listen: below the kernel's ephemeral range. A port from ``bind(0)``
is in that range, which every outgoing connection draws its source port from, so between the
test choosing it and the server binding it (or a killed server restarting on it) a client's
connection could take it: `address already in use` under a loaded machine."""
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, outside the ephemeral range, not handed out before
    in this process."""
    for _ in range(1000):
        port = random.choice(_LISTEN_PORTS)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f'no free loopback port in {_LISTEN_PORTS}')


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f'{what} not ready within {timeout}s')


def stop(process: subprocess.Popen[bytes], timeout: float = 15.0) -> int:
    """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return int(process.returncode)


class RedisServer:
    def __init__(self, port: int | None = None, *extra: str) -> None:
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix='shoal-test-redis-')
        binary = shutil.which('redis-server')
        assert binary, 'redis-server is not installed (make test installs it)'
        self.process = subprocess.Popen(
            [binary, '--port', str(self.port), '--bind', LOOPBACK, '--save', '',
             '--appendonly', 'no', '--dir', self.dir, '--loglevel', 'warning',
             *QUICK_REPLICATION, *extra],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(self._pings, 10, 'redis-server')

    @property
    def url(self) -> str:
        return f'redis://{LOOPBACK}:{self.port}/0'

    def _pings(self) -> bool:
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=0.5) as s:
                s.sendall(b'PING\r\n')
                return s.recv(16).startswith((b'+PONG', b'-NOAUTH'))  # up, with a password
        except OSError:
            return False

    def linked(self) -> bool:
        """A replica whose link to its primary is up (INFO replication)."""
        client = redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=1)
        try:
            return client.info('replication').get('master_link_status') == 'up'
        except redis.exceptions.RedisError:
            return False
        finally:
            client.close()

    def stop(self) -> None:
        stop(self.process)
        shutil.rmtree(self.dir, ignore_errors=True)


class BrokerProcess:
    """``python -m shoal_broker`` on free ports; ready once /readyz says so."""

    def __init__(
        self,
        redis_url: str | None,
        *,
        env: Mapping[str, str] | None = None,
        replica_id: str | None = None,
        data_dir: str | None = None,
        own_session: bool = False,
    ) -> None:
        """``own_session``: lead a process group of its own, so a test can signal the group
        the way a terminal's Ctrl-C does."""
        self.port = free_port()
        self.http_port = free_port()
        self.replica_id = replica_id or f'test-{self.port}'
        fd, path = tempfile.mkstemp(prefix='shoal-broker-', suffix='.log', dir=LOG_DIR)
        os.close(fd)
        self.log_path = Path(path)
        args = [
            sys.executable, '-m', 'shoal_broker', '--listen', f'{LOOPBACK}:{self.port}',
            '--http', f'{LOOPBACK}:{self.http_port}', '--replica-id', self.replica_id,
        ]  # fmt: skip
        if redis_url:
            args += ['--redis-url', redis_url]
        if data_dir:
            args += ['--data-dir', data_dir]
        # A shared broker sees thousands of addresses in a full run, all created by one user,
        # and the security tests' failed logins all come from one loopback address: the limits
        # on those are off unless a test sets them (tests/security covers each).
        full_env = {
            **os.environ, 'SHOAL_LOG_LEVEL': 'INFO', 'SHOAL_METRICS_MAX_ADDRESSES': '0',
            'SHOAL_MAX_AUTO_CREATED_ADDRESSES_PER_USER': '0',
            'SHOAL_MAX_FAILED_LOGINS_PER_MINUTE': '0', **(env or {}),
        }  # fmt: skip
        self._log = self.log_path.open('wb')
        self.process = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, env=full_env,
            start_new_session=own_session,
        )  # fmt: skip
        try:
            wait_for(self.ready, 20, f'broker on port {self.port}')
        except (TimeoutError, AssertionError):
            self.stop()
            raise AssertionError(f'broker did not start:\n{self.log()}') from None

    @property
    def url(self) -> str:
        return f'amqp://{LOOPBACK}:{self.port}'

    @property
    def pid(self) -> int:
        return self.process.pid

    def http_get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(
                f'http://{LOOPBACK}:{self.http_port}{path}', timeout=2
            ) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f'broker exited with {self.process.returncode}:\n{self.log()}')
        try:
            return self.http_get('/readyz')[0] == 200
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors='replace')

    def stop(self) -> int:
        code = stop(self.process)
        self._log.close()
        return code


@contextlib.contextmanager
def broker(redis_url: str | None, **kwargs) -> Iterator[BrokerProcess]:  # type: ignore[no-untyped-def]
    b = BrokerProcess(redis_url, **kwargs)
    try:
        yield b
    finally:
        b.stop()
