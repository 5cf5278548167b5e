"""
The start scripts the chart's sentinel mode runs (ConfigMap ``<fullname>-redis-scripts``), run as
rendered with real redis-server and sentinel processes on loopback: three nodes and three
sentinels come up as one group, a failover after kill -9 of the primary is seen by
``SENTINEL get-master-addr-by-name``, and a node or sentinel started again afterwards joins the
promoted primary instead of the old one. The rendered pods give the scripts every variable they
read.
"""

import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from chartrender import container, find, one, render
from processes import LOOPBACK, free_port, stop, wait_for

PASSWORD = 'pass word'  # a space survives the sentinel's config file and the arguments
SERVICE = 'shoal'
VALUES = {'redis': {'mode': 'sentinel'}}


def scripts() -> dict[str, str]:
    configmap = one(render(VALUES), 'ConfigMap', 'rel-shoal-redis-scripts')
    return dict(configmap['data'])


def variables_read(script: str) -> set[str]:
    found = set(re.findall(r'\$\{?([A-Z_]+)', script))
    return found - {'REDIS_PASSWORD'}  # optional: only with redis.auth.enabled


def test_the_pods_give_the_scripts_every_variable_they_read() -> None:
    texts = scripts()
    manifests = render(VALUES)
    pods = {m['metadata']['name']: m['spec']['template']['spec']
            for m in find(manifests, 'StatefulSet')}  # fmt: skip
    for name, script, container_name in (
        ('rel-shoal-redis', 'redis-start.sh', 'redis'),
        ('rel-shoal-redis-replica', 'redis-start.sh', 'redis'),
        ('rel-shoal-redis-sentinel', 'sentinel-start.sh', 'sentinel'),
    ):
        env = {e['name'] for e in container(pods[name], container_name)['env']}
        read = variables_read(texts[script] + texts['find-primary.sh'])  # which both source
        assert read <= env, (name, read - env)
        assert 'REDIS_PASSWORD' in env
        assert container(pods[name], container_name)['command'] == ['sh', f'/scripts/{script}']


class Group:
    """Nodes and sentinels started through the chart's scripts, stopped by PID."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.texts = scripts()
        for name, text in self.texts.items():
            (directory / name).write_text(text)
        self.node_ports = [free_port() for _ in range(3)]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.common = {
            'PATH': os.environ['PATH'],
            'SELF': LOOPBACK,
            'FIRST_NODE': f'{LOOPBACK}:{self.node_ports[0]}',
            'SENTINELS': ' '.join(f'{LOOPBACK}:{p}' for p in self.sentinel_ports),
            'SERVICE': SERVICE,
            'REDIS_PASSWORD': PASSWORD,
            'REDISCLI_AUTH': PASSWORD,
        }

    def node(self, port: int) -> None:
        data = self.dir / f'node-{port}'
        data.mkdir(exist_ok=True)
        env = {**self.common, 'REDIS_PORT': str(port)}
        args = ['--dir', str(data), '--appendonly', 'yes', '--save', '', '--bind', LOOPBACK,
                '--loglevel', 'warning']  # fmt: skip
        self._start(port, 'redis-start.sh', env, args)
        wait_for(lambda: self._answers(port), 15, f'node {port}')

    def sentinel(self, port: int) -> None:
        env = {**self.common, 'SENTINEL_PORT': str(port), 'QUORUM': '2',
               'DOWN_AFTER_MS': '1000', 'FAILOVER_TIMEOUT_MS': '3000',
               'CONFIG': str(self.dir / f'sentinel-{port}.conf')}  # fmt: skip
        self._start(port, 'sentinel-start.sh', env, ['--bind', LOOPBACK, '--loglevel', 'warning'])
        wait_for(lambda: self._answers(port), 15, f'sentinel {port}')

    def _start(self, port: int, script: str, env: dict[str, str], args: list[str]) -> None:
        log = (self.dir / f'{port}.log').open('wb')
        self.processes[port] = subprocess.Popen(
            ['sh', str(self.dir / script), *args], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host=LOOPBACK, port=port, password=PASSWORD, socket_timeout=2,
                           decode_responses=True)  # fmt: skip

    def _answers(self, port: int) -> bool:
        with self.client(port) as client:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

    def primary(self, sentinel: int) -> int | None:
        with self.client(sentinel) as client:
            try:
                address = client.execute_command('SENTINEL', 'get-master-addr-by-name', SERVICE)
            except redis.RedisError:
                return None
        return int(address[1]) if address else None

    def role(self, port: int) -> tuple[str, int | None]:
        with self.client(port) as client:
            role = client.execute_command('ROLE')
        return (role[0], int(role[2])) if role[0] == 'slave' else (role[0], None)

    def settled(self, primary: int) -> bool:
        """Every running sentinel names ``primary``, knows two replicas and two sentinels."""
        for port in self.sentinel_ports:
            if self.processes[port].poll() is not None:
                continue
            with self.client(port) as client:
                try:
                    state = client.execute_command('SENTINEL', 'master', SERVICE)
                except redis.RedisError:
                    return False
            counts = (state['port'], state['num-slaves'], state['num-other-sentinels'])
            if tuple(int(n) for n in counts) != (primary, 2, 2):
                return False
        return True

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                stop(process)


@pytest.fixture
def group() -> Iterator[Group]:
    with tempfile.TemporaryDirectory(prefix='shoal-test-chart-sentinel-') as directory:
        found = Group(Path(directory))
        try:
            yield found
        finally:
            found.stop()


def test_a_failover_is_followed_and_restarted_members_join_the_promoted_primary(
    group: Group,
) -> None:
    first, *replicas = group.node_ports
    for port in group.node_ports:
        group.node(port)
    assert group.role(first) == ('master', None)
    assert [group.role(p) for p in replicas] == [('slave', first)] * 2
    for port in group.sentinel_ports:
        group.sentinel(port)
    wait_for(lambda: group.settled(first), 30, 'the sentinels agreeing on the group')
    with group.client(first) as client:
        client.set('kept', 'yes')
        assert client.wait(2, 5000) == 2

    group.processes[first].send_signal(signal.SIGKILL)
    group.processes[first].wait(10)
    sentinel = group.sentinel_ports[0]
    wait_for(lambda: group.primary(sentinel) in replicas, 20, 'a replica promoted')
    promoted = group.primary(sentinel)
    assert promoted is not None
    assert group.role(promoted) == ('master', None)
    with group.client(promoted) as client:
        assert client.get('kept') == 'yes'

    # the old first node comes back as a replica of the promoted one, not as a second primary
    group.node(first)
    assert group.role(first) == ('slave', promoted)
    # a sentinel started again monitors the promoted primary, as the others tell it
    restarted = group.sentinel_ports[2]
    stop(group.processes[restarted])
    group.sentinel(restarted)
    assert group.primary(restarted) == promoted
    wait_for(lambda: group.settled(promoted), 30, 'the sentinels agreeing after the failover')
