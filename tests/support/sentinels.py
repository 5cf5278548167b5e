"""A Redis primary, its replica and three sentinels on free loopback ports, stopped by PID.

The sentinels take the primary for down after ``down_after_ms`` and finish a failover within
``failover_timeout_ms``, both small, so a test can kill the primary and see the replica promoted
in a few seconds."""

import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
from processes import LOOPBACK, RedisServer, free_port, stop, wait_for

SERVICE = 'shoal'


class SentinelGroup:
    def __init__(
        self,
        *extra: str,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        password: str = '',
        sentinel_password: str = '',
    ) -> None:
        """``password``: the Redis servers require it (and the replica and the sentinels use
        it); ``sentinel_password``: the sentinels require it."""
        self.password, self.sentinel_password = password, sentinel_password
        auth = ('--requirepass', password, '--masterauth', password) if password else ()
        self.extra = (*auth, *extra)
        self.servers: list[RedisServer] = []
        self.sentinels: list[tuple[int, subprocess.Popen[bytes]]] = []
        self.dir = Path(tempfile.mkdtemp(prefix='shoal-test-sentinel-'))
        try:
            primary = self.server()
            self.server('--replicaof', LOOPBACK, str(primary.port))
            wait_for(lambda: self._linked(self.servers[1].port), 15, 'replica link')
            for _ in range(3):
                self._start_sentinel(primary.port, down_after_ms, failover_timeout_ms)
            wait_for(self._settled, 30, 'sentinels seeing each other and the replica')
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        hosts = ','.join(f'{LOOPBACK}:{port}' for port, _ in self.sentinels)
        credentials = f':{self.password}@' if self.password else ''
        query = f'?sentinel_password={self.sentinel_password}' if self.sentinel_password else ''
        return f'redis+sentinel://{credentials}{hosts}/{SERVICE}/0{query}'

    def client(self, port: int) -> redis.Redis:
        """A client of the Redis server on ``port``."""
        return redis.Redis(host=LOOPBACK, port=port, password=self.password or None)

    def _sentinel_client(self, port: int) -> redis.Redis:
        return redis.Redis(
            host=LOOPBACK, port=port, socket_timeout=1, password=self.sentinel_password or None
        )

    def server(self, *args: str, port: int | None = None) -> RedisServer:
        """Start a redis-server (kept for ``stop``)."""
        s = RedisServer(port, *self.extra, *args)
        self.servers.append(s)
        return s

    def primary_port(self) -> int | None:
        """The primary's port as the first sentinel that answers names it."""
        for port, process in self.sentinels:
            if process.poll() is not None:
                continue
            client = self._sentinel_client(port)
            try:
                address = client.sentinel_get_master_addr_by_name(SERVICE)
                return int(address[1]) if address else None
            except redis.exceptions.RedisError:
                continue
            finally:
                client.close()
        return None

    def running(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port and s.process.poll() is None)

    def _start_sentinel(self, primary: int, down_after_ms: int, failover_ms: int) -> None:
        port = free_port()
        conf = self.dir / f'sentinel-{port}.conf'
        conf.write_text(
            f'port {port}\nbind {LOOPBACK}\ndir {self.dir}\n'
            f'sentinel monitor {SERVICE} {LOOPBACK} {primary} 2\n'
            f'sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n'
            f'sentinel failover-timeout {SERVICE} {failover_ms}\n'
            f'sentinel parallel-syncs {SERVICE} 1\n'
            + (f'sentinel auth-pass {SERVICE} {self.password}\n' if self.password else '')
            + (f'requirepass {self.sentinel_password}\n' if self.sentinel_password else '')
        )
        binary = shutil.which('redis-server')
        assert binary, 'redis-server is not installed'
        process = subprocess.Popen(
            [binary, str(conf), '--sentinel', '--loglevel', 'warning'], stdout=subprocess.DEVNULL
        )
        self.sentinels.append((port, process))

    def _every_sentinel(self, holds: Callable[[redis.Redis], bool]) -> bool:
        """Whether ``holds`` is true asked of every sentinel (false if one does not answer)."""
        for port, _ in self.sentinels:
            client = self._sentinel_client(port)
            try:
                if not holds(client):
                    return False
            except redis.exceptions.RedisError:
                return False
            finally:
                client.close()
        return True

    def _settled(self) -> bool:
        def settled(client: redis.Redis) -> bool:
            state = client.sentinel_master(SERVICE)
            return int(state['num-slaves']) >= 1 and int(state['num-other-sentinels']) >= 2

        return self._every_sentinel(settled)

    def _linked(self, port: int) -> bool:
        client = redis.Redis(
            host=LOOPBACK, port=port, socket_timeout=1, password=self.password or None
        )
        try:
            return client.info('replication').get('master_link_status') == 'up'
        except redis.exceptions.RedisError:
            return False
        finally:
            client.close()

    def wait_linked(self, port: int, timeout: float) -> None:
        wait_for(lambda: self._linked(port), timeout, f'replica on {port} linked')

    def _replica_ready(self, port: int) -> bool:
        """Every sentinel knows the replica on ``port``, up and linked: one it may promote."""

        def knows(client: redis.Redis) -> bool:
            return any(
                int(r['port']) == port and not r.get('is_sdown') and not r.get('is_odown')
                and r.get('master-link-status') == 'ok'
                for r in client.sentinel_slaves(SERVICE)
            )  # fmt: skip

        return self._every_sentinel(knows)

    def wait_replica_ready(self, port: int, timeout: float) -> None:
        """Wait until the sentinels could promote the replica on ``port`` (they learn of a
        replica from its primary's INFO, every 10 s outside a failover)."""
        wait_for(lambda: self._replica_ready(port), timeout, f'sentinels seeing replica {port}')

    def wait_promoted(self, old: int, timeout: float) -> tuple[int, float]:
        """Wait until the sentinels name a primary other than ``old``: (its port, monotonic
        time when that was first seen)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port is not None and port != old:
                return port, time.monotonic()
            time.sleep(0.02)
        raise TimeoutError(f'no failover from {old} within {timeout}s')

    def stop(self) -> None:
        for _, process in self.sentinels:
            stop(process)
        for s in self.servers:
            if s.process.poll() is None:
                s.process.send_signal(signal.SIGCONT)
            s.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
