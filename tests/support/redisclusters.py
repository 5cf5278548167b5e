"""A Redis Cluster of three primaries and three replicas on free loopback ports, stopped by PID.

Made as an operator makes one: six ``redis-server --cluster-enabled yes`` processes, then
``redis-cli --cluster create ... --cluster-replicas 1``. The cluster bus gets a free port of its
own (``cluster-port``) rather than the client port + 10000, which may be taken or past 65535.
``cluster-node-timeout`` is small, so a test can kill a primary and see its replica promoted
within a few seconds; ``cluster-replica-validity-factor 0`` lets a replica fail over however
long its link was down (a loaded test machine must not leave a slot without a primary).
``repl-ping-replica-period`` is small because CLUSTER SLOTS lists a replica only once its
replication offset is past zero, and on an empty primary only that ping moves it: at the default
ten seconds, a new cluster took that long to show its replicas.

For the chaos tests: ``kill_primary_of`` (kill -9 the primary serving a key's slot and wait for a
replica to take over), ``restart`` (the killed node rejoins, as a replica), and ``migrate_slot``
(move one slot to another primary key by key, as ``redis-cli --cluster reshard`` does, while
clients keep using it: MOVED and ASK replies are theirs to follow).
"""

import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis
from processes import LOOPBACK, ONE_ATTEMPT, QUICK_REPLICATION, free_port, stop, wait_for

NODE_TIMEOUT_MS = 1000
"""``cluster-node-timeout``: a primary unreachable this long is failing; its replica takes over
about a second after that."""

MIGRATE_TIMEOUT_MS = 5000
"""The MIGRATE command's own timeout for one batch of keys."""


class ClusterNode:
    """One ``redis-server`` of the cluster: its client port, cluster bus port and directory
    (``nodes.conf`` lives there, so a killed node restarted keeps its identity)."""

    def __init__(self, directory: Path, extra: tuple[str, ...]) -> None:
        self.port = free_port()
        self.bus_port = free_port()
        self.dir = directory / str(self.port)
        self.dir.mkdir()
        self.extra = extra
        self.process: subprocess.Popen[bytes] = self._spawn()

    @property
    def url(self) -> str:
        return f'redis://{LOOPBACK}:{self.port}/0'

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def _spawn(self) -> subprocess.Popen[bytes]:
        binary = shutil.which('redis-server')
        assert binary, 'redis-server is not installed (make test installs it)'
        process = subprocess.Popen(
            [binary, '--port', str(self.port), '--bind', LOOPBACK, '--save', '',
             '--appendonly', 'no', '--dir', str(self.dir), '--loglevel', 'warning',
             '--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf',
             '--cluster-port', str(self.bus_port),
             '--cluster-node-timeout', str(NODE_TIMEOUT_MS),
             '--cluster-replica-validity-factor', '0', *QUICK_REPLICATION,
             '--repl-ping-replica-period', '1', *self.extra],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(self._pings, 10, f'redis-server {self.port}')
        return process

    def client(self, timeout: float = 2.0, *, retry: bool = True) -> redis.Redis:
        """A plain (not cluster-aware) client of this node. ``retry=False``: one attempt per
        command (``ONE_ATTEMPT``), for a watch that must see a killed node as it happens."""
        if retry:
            return redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=timeout)
        return redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=timeout, retry=ONE_ATTEMPT)

    def _pings(self) -> bool:
        client = self.client(0.5)
        try:
            return bool(client.ping())
        except redis.exceptions.RedisError:
            return False
        finally:
            client.close()

    def kill(self) -> None:
        """kill -9: no goodbye to the cluster, no chance to save anything."""
        if self.running:
            self.process.send_signal(signal.SIGCONT)  # a stopped process dies only once resumed
            self.process.kill()
            self.process.wait()

    def start(self) -> None:
        """Start the node again on its port and directory (it rejoins with its ``nodes.conf``)."""
        assert not self.running, f'redis-server {self.port} is still running'
        self.process = self._spawn()

    def stop(self) -> None:
        if self.running:
            self.process.send_signal(signal.SIGCONT)
        stop(self.process)


class ClusterGroup:
    def __init__(self, *extra: str, primaries: int = 3, replicas_per_primary: int = 1) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix='shoal-test-cluster-'))
        self.nodes: list[ClusterNode] = []
        try:
            for _ in range(primaries * (1 + replicas_per_primary)):
                self.nodes.append(ClusterNode(self.dir, extra))
            binary = shutil.which('redis-cli')
            assert binary, 'redis-cli is not installed (make test installs it)'
            subprocess.run(
                [binary, '--cluster', 'create',
                 *(f'{LOOPBACK}:{node.port}' for node in self.nodes),
                 '--cluster-replicas', str(replicas_per_primary), '--cluster-yes'],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60,
            )  # fmt: skip
            wait_for(lambda: self._settled(primaries, replicas_per_primary), 60, 'cluster_state:ok')
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL brokers are given: every node a seed."""
        return 'redis+cluster://' + ','.join(f'{LOOPBACK}:{n.port}' for n in self.nodes)

    @property
    def seed(self) -> ClusterNode:
        """A live node, for cluster-wide questions."""
        return next(node for node in self.nodes if node.running)

    def client(self) -> 'redis.cluster.RedisCluster':
        """A cluster-aware client (follows MOVED and ASK), for tests reading the cluster."""
        return redis.cluster.RedisCluster(host=LOOPBACK, port=self.seed.port, socket_timeout=2)

    def node(self, port: int) -> ClusterNode:
        return next(node for node in self.nodes if node.port == port)

    # -- what the cluster looks like ----------------------------------------------------------

    def _ask(self, node: ClusterNode, *command: str, retry: bool = True) -> object:
        client = node.client(1.0, retry=retry)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def keyslot(self, key: str) -> int:
        return int(self._ask(self.seed, 'CLUSTER', 'KEYSLOT', key))  # type: ignore[call-overload]

    def owner_of_slot(
        self, slot: int, asking: ClusterNode | None = None, *, retry: bool = True
    ) -> int:
        """The client port of the primary ``asking`` (any live node) says serves ``slot``;
        ``retry=False``: asked once (``ClusterNode.client``)."""
        for start, end, primary, *_ in self._slots(asking or self.seed, retry=retry):
            if start <= slot <= end:
                return int(primary[1])
        raise LookupError(f'slot {slot} is not served')

    def primary_of(self, key: str) -> ClusterNode:
        return self.node(self.owner_of_slot(self.keyslot(key)))

    def primaries(self) -> list[ClusterNode]:
        ports = {int(entry[2][1]) for entry in self._slots(self.seed)}
        return [node for node in self.nodes if node.port in ports]

    def names_on_every_primary(self, prefix: str, key_of: Callable[[str], str]) -> list[str]:
        """One new name ``prefix-…`` per primary: each one's key (``key_of(name)``) has its
        slot served by a different primary."""
        count = len(self.primaries())
        found: dict[int, str] = {}
        while len(found) < count:
            name = f'{prefix}-{uuid.uuid4().hex[:8]}'
            found.setdefault(self.primary_of(key_of(name)).port, name)
        return list(found.values())

    def _slots(self, node: ClusterNode, *, retry: bool = True) -> list[list[object]]:
        raw = self._ask(node, 'CLUSTER', 'SLOTS', retry=retry)
        slots: list[list[object]] = []
        for entry in raw:  # type: ignore[attr-defined]
            slots.append(list(entry))
        return slots

    def _info(self, node: ClusterNode) -> dict[str, str]:
        raw = self._ask(node, 'CLUSTER', 'INFO')
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return dict(line.split(':', 1) for line in text.split() if ':' in line)

    def _node_id(self, node: ClusterNode) -> str:
        raw = self._ask(node, 'CLUSTER', 'MYID')
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def _settled(self, primaries: int, replicas_per_primary: int) -> bool:
        """Every node says ``cluster_state:ok`` with all slots served, and sees every primary
        with its replicas."""
        try:
            for node in self.nodes:
                if not node.running:
                    continue
                info = self._info(node)
                if info.get('cluster_state') != 'ok' or info.get('cluster_slots_ok') != '16384':
                    return False
                shards = self._slots(node)
                if len({int(s[2][1]) for s in shards}) != primaries:  # type: ignore[index]
                    return False
                if any(len(s) - 3 < replicas_per_primary for s in shards):
                    return False
        except redis.exceptions.RedisError:
            return False
        return True

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every running node says ``cluster_state:ok`` with all slots served."""

        def ok() -> bool:
            try:
                return all(
                    self._info(node).get('cluster_state') == 'ok'
                    and self._info(node).get('cluster_slots_ok') == '16384'
                    for node in self.nodes
                    if node.running
                )
            except redis.exceptions.RedisError:
                return False

        wait_for(ok, timeout, 'cluster_state:ok')

    # -- chaos ----------------------------------------------------------------------------------

    def kill_primary_of(self, key: str, timeout: float = 30.0) -> tuple[ClusterNode, int, float]:
        """kill -9 the primary serving ``key``'s slot and wait until every live node names
        another primary for it and the cluster is ok again: (the killed node, the new primary's
        port, monotonic time the promotion was first seen). Restart the killed node with
        ``restart`` to give the new primary a replica again."""
        slot = self.keyslot(key)
        victim = self.node(self.owner_of_slot(slot))
        victim.kill()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                owners = {self.owner_of_slot(slot, node) for node in self.nodes if node.running}
            except (redis.exceptions.RedisError, LookupError):
                owners = set()
            if len(owners) == 1 and victim.port not in owners:
                promoted = time.monotonic()
                self.wait_ok(max(deadline - time.monotonic(), 1.0))
                return victim, owners.pop(), promoted
            time.sleep(0.02)
        raise TimeoutError(f'no replica took over slot {slot} from {victim.port} in {timeout}s')

    def restart(self, node: ClusterNode, timeout: float = 30.0) -> None:
        """Start a killed node again and wait until it is linked to its primary as a replica."""
        node.start()

        def linked() -> bool:
            try:
                info = node.client(1.0).info('replication')
            except redis.exceptions.RedisError:
                return False
            return info.get('role') == 'slave' and info.get('master_link_status') == 'up'

        wait_for(linked, timeout, f'redis-server {node.port} linked as a replica')
        self.wait_ok(timeout)

    def migrate_slot(
        self,
        slot: int,
        target: ClusterNode,
        *,
        batch: int = 10,
        between_batches: Callable[[], None] | None = None,
    ) -> int:
        """Move ``slot`` to the primary ``target`` as ``redis-cli --cluster reshard`` does:
        IMPORTING on the target, MIGRATING on the source, MIGRATE ``batch`` keys at a time
        (``between_batches`` runs after each: the window where clients get ASK), then every
        primary is told the new owner. Returns the number of keys moved."""
        source = self.node(self.owner_of_slot(slot))
        if source is target:
            return 0
        source_id, target_id = self._node_id(source), self._node_id(target)
        self._ask(target, 'CLUSTER', 'SETSLOT', str(slot), 'IMPORTING', source_id)
        self._ask(source, 'CLUSTER', 'SETSLOT', str(slot), 'MIGRATING', target_id)
        moved = 0
        client = source.client(MIGRATE_TIMEOUT_MS / 1000 + 5)
        try:
            while True:
                names = client.execute_command('CLUSTER', 'GETKEYSINSLOT', slot, batch)
                if not names:
                    break
                client.execute_command(
                    'MIGRATE', LOOPBACK, target.port, '', 0, MIGRATE_TIMEOUT_MS, 'KEYS', *names
                )
                moved += len(names)
                if between_batches is not None:
                    between_batches()
        finally:
            client.close()
        # the target first, then the source (as redis-cli does), then every other primary
        self._ask(target, 'CLUSTER', 'SETSLOT', str(slot), 'NODE', target_id)
        self._ask(source, 'CLUSTER', 'SETSLOT', str(slot), 'NODE', target_id)
        for node in self.primaries():
            if node not in (source, target):
                self._ask(node, 'CLUSTER', 'SETSLOT', str(slot), 'NODE', target_id)
        wait_for(
            lambda: all(
                self.owner_of_slot(slot, node) == target.port for node in self.nodes if node.running
            ),
            30,
            f'every node seeing slot {slot} on {target.port}',
        )
        return moved

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
