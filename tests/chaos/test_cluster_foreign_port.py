"""A killed cluster primary's port answered by something that is not Redis while its replica
takes over (store/lanes.py).

Between a ``kill -9`` and the promotion the slot map still names the dead node, and the lanes
keep connecting to its address; on a machine running other services that port may be taken by
one of them (another broker's AMQP or HTTP listener, here a plain server answering an HTTP
error). redis-py refuses such a reply as an ``InvalidResponse``, not a connection error: a lane
that let it through left its units counted in flight for ever, and once the slot had moved
every later unit of the slot waited behind them, so no send to the queue was answered again.
"""

import contextlib
import socket
import threading
import time
import uuid

import pytest
import redis
from failoverload import REPLICATED, synchronous_load
from loadclient import ChaosRun
from processes import LOOPBACK
from redisclusters import ClusterGroup, ClusterNode

from shoal_broker.store import keys


class ForeignServer:
    """Listens on a port and answers every connection with an HTTP error, as a web server
    does to bytes it cannot parse; stopped by ``close``."""

    def __init__(self, port: int) -> None:
        self.listener = socket.create_server((LOOPBACK, port))
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with contextlib.suppress(OSError), client:
                client.settimeout(1)
                client.recv(65536)
                client.sendall(b'HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n')

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accepting thread, which lets go of it
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


def _promoted(group: ClusterGroup, slot: int, victim: ClusterNode, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            owners = {group.owner_of_slot(slot, n) for n in group.nodes if n.running}
        except (redis.exceptions.RedisError, LookupError):
            owners = set()
        if len(owners) == 1 and victim.port not in owners:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_dead_primarys_port_answered_by_another_server_does_not_stall_the_slot(cluster) -> None:  # type: ignore[no-untyped-def]
    group = ClusterGroup()
    try:
        queue = f'foreign-{uuid.uuid4().hex[:8]}'
        b = cluster.broker(group.url, replica_id=f'foreign-{queue[-4:]}', env=REPLICATED)
        count = 600
        run = synchronous_load(b.url, queue, count, timeout=120)
        try:
            assert run.wait(lambda r: len(r.accepted) >= 100, timeout=60), run.state()
            slot = group.keyslot(keys.AddressKeys.of(queue).tag)
            victim = group.node(group.owner_of_slot(slot))
            victim.kill()
            foreign = ForeignServer(victim.port)  # the port taken the moment it is free
            try:
                assert _promoted(group, slot, victim, timeout=30)
                group.wait_ok()
            finally:
                foreign.close()
            group.restart(victim)  # the promoted primary's replica again: WAIT 1 confirms
            finished = run.wait(ChaosRun.delivered_all, timeout=60)
            time.sleep(0.5)
        finally:
            run.stop()
    finally:
        group.stop()
    cluster.report(
        f'the dead primary port answered by an HTTP server ({foreign.connections} connections '
        f'to it): {len(run.accepted)} of {count} accepted, {len(run.rejected)} rejected, '
        f'{run.released} released, {len(run.in_doubt)} in doubt'
    )
    assert foreign.connections >= 1  # the broker did try the dead node's address
    assert finished, f'{run.state()}\n{b.log()[-6000:]}'
    assert not run.rejected, run.rejected[:3]
    assert run.released == 0
    assert run.accepted == set(range(count))
    assert not run.missing()
    assert b.process.poll() is None
