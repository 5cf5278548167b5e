"""
The embedded Redis: a ``redis-server`` child process for a broker started without a Redis URL.

So that one command runs a real broker (DESIGN.md §5). Append-only file on, data in a directory
the user names, reachable only through a Unix socket in a private temporary directory. Stopped
(SIGTERM, then SIGKILL after a bound) when the broker exits; on Linux the kernel also sends it
SIGTERM when the broker dies without stopping it (kill -9, OOM kill), so no orphaned Redis keeps
the data directory and its AOF locked. Once it answers, its URL is announced for the ``shoal``
command (``discovery.py``) until it stops.
"""

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import redis.asyncio

from shoal_broker.store import discovery

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_SECONDS = 10.0
PR_SET_PDEATHSIG = 1
SOCKET_DIR_PREFIX = 'shoal-redis-'
"""Then the broker's pid: a broker killed with SIGKILL cannot remove its socket directory, so
the next embedded Redis of this user removes those whose broker is gone."""


class EmbeddedRedis:
    def __init__(self, data_dir: str, *, appendfsync: str = 'everysec') -> None:
        self.data_dir = Path(data_dir).resolve()
        self.appendfsync = appendfsync
        _remove_stale_socket_dirs()
        self._socket_dir = Path(tempfile.mkdtemp(prefix=f'{SOCKET_DIR_PREFIX}{os.getpid()}-'))
        self.socket = self._socket_dir / 'redis.sock'
        self._process: subprocess.Popen[bytes] | None = None
        self._announced: list[Path] = []

    @property
    def url(self) -> str:
        return f'unix://{self.socket}'

    async def start(self) -> None:
        binary = shutil.which('redis-server')
        if binary is None:
            raise RuntimeError('redis-server is not installed (make run installs it)')
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            binary, '--port', '0', '--unixsocket', str(self.socket), '--unixsocketperm', '700',
            '--dir', str(self.data_dir), '--appendonly', 'yes', '--appendfsync', self.appendfsync,
            '--save', '', '--daemonize', 'no', '--loglevel', 'warning', '--logfile', 'redis.log',
        ]  # fmt: skip
        self._spawn(command)
        assert self._process is not None
        logger.info(
            'embedded redis-server pid %d, data and redis.log in %s',
            self._process.pid,
            self.data_dir,
        )
        deadline = asyncio.get_running_loop().time() + STARTUP_TIMEOUT_SECONDS
        client = redis.asyncio.Redis(unix_socket_path=str(self.socket))
        try:
            while True:
                if self._process.poll() is not None:
                    raise RuntimeError(f'redis-server exited with {self._process.returncode}')
                with contextlib.suppress(OSError, redis.exceptions.ConnectionError):
                    if await client.ping():
                        self._announced = discovery.announce(self.data_dir, self.url)
                        return
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError('redis-server did not answer in time')
                await asyncio.sleep(0.05)
        finally:
            await client.aclose()

    def _spawn(self, command: list[str]) -> None:
        # fork+exec returns at once; only the readiness wait below needs to be asynchronous.
        # A session of its own: a terminal's Ctrl-C signals the whole foreground process group,
        # and a Redis stopping with the broker could not take back what the broker returns on
        # its way out (held messages, its lease); the broker stops it last (and the kernel
        # signals it if the broker dies first).
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            preexec_fn=_terminate_with_parent(),
            start_new_session=True,
        )

    def stop(self) -> None:
        discovery.withdraw(self._announced)
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STARTUP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        with contextlib.suppress(OSError):
            if self.socket.exists():
                os.unlink(self.socket)
            self._socket_dir.rmdir()


def _terminate_with_parent() -> 'Callable[[], None] | None':
    """A pre-exec hook asking Linux to SIGTERM the child when this process dies. libc is loaded
    here, before the fork, so the child only makes the one call (the broker starts its Redis
    before it runs any thread)."""
    if not sys.platform.startswith('linux'):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)
    prctl = libc.prctl
    signum = int(signal.SIGTERM)

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)

    return hook


def _remove_stale_socket_dirs() -> None:
    """Remove this user's socket directories whose broker process no longer exists. A directory
    is only removed when it holds nothing but the socket; a reused pid keeps one (harmless)."""
    for path in Path(tempfile.gettempdir()).glob(f'{SOCKET_DIR_PREFIX}*-*'):
        pid_text = path.name[len(SOCKET_DIR_PREFIX) :].partition('-')[0]
        if not pid_text.isdigit():
            continue  # named before the pid was part of the name
        try:
            if path.stat().st_uid != os.getuid() or _process_exists(int(pid_text)):
                continue
            for item in path.iterdir():
                if item.name != 'redis.sock':
                    break
            else:
                with contextlib.suppress(FileNotFoundError):
                    (path / 'redis.sock').unlink()
                path.rmdir()
        except OSError as exc:  # another broker removing it at the same time, or not ours
            logger.debug('stale socket directory %s left: %s', path, exc)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
