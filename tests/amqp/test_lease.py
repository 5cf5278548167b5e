"""The lease judged by what happened, not by how late the renewal came.

A replica whose lease expired while nobody reaped it (no other replica, or none got to it yet)
still owns everything it holds: its renewal comes back ``late`` and it serves on. Only a reaped
replica drops its clients (covered by the chaos tests).
"""

import os
import signal
import time

from amqpclient import connect, receive_all, receiver, sender
from processes import RedisServer, broker, wait_for
from proton import Message

LEASE_SECONDS = 1


def test_a_replica_paused_past_its_lease_and_not_reaped_keeps_its_clients(address: str) -> None:
    redis = RedisServer()  # its own: replicas of the shared Redis would reap the paused one
    try:
        with broker(redis.url, env={'SHOAL_LEASE_SECONDS': str(LEASE_SECONDS)}) as b:
            conn = connect(b.url)
            snd = sender(conn, address)
            rcv = receiver(conn, address, credit=10)
            snd.send(Message(body='before'))
            assert [m.body for m in receive_all(rcv, 1)] == ['before']
            os.kill(b.pid, signal.SIGSTOP)  # every thread, the lease keeper's too
            try:
                time.sleep(LEASE_SECONDS * 2.5)
            finally:
                os.kill(b.pid, signal.SIGCONT)
            wait_for(lambda: 'renewed after it expired' in b.log(), 10, 'the late renewal')
            snd.send(Message(body='after'))
            assert [m.body for m in receive_all(rcv, 1)] == ['after']
            assert 'lease lapsed' not in b.log()
            assert b'shoal_replica_lease_up 1.0' in b.http_get('/metrics')[1]
            conn.close()
    finally:
        redis.stop()
