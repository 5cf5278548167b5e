"""
Transactions as Qpid JMS drives them (jms-amqp-facts §7), over proton's blocking client.

A coordinator link (target type coordinator, capability amqp:local-transactions); declare and
discharge as amqp-value bodies; transactional sends carry transactional-state(txn-id);
transactional acks are settled at once with transactional-state(txn-id, accepted).
"""

import uuid
from typing import Any

from proton import Array, Data, Described, Link, Message, Terminus, symbol, ulong
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender

TIMEOUT = 10
DECLARED, TRANSACTIONAL_STATE, ACCEPTED = 0x33, 0x34, 0x24


class CoordinatorTarget(LinkOption):
    def apply(self, link: Link) -> None:
        link.target.type = Terminus.COORDINATOR
        link.target.capabilities.put_object(
            Array(Data.NULL, Data.SYMBOL, symbol('amqp:local-transactions'))
        )


class Controller:
    def __init__(self, conn: BlockingConnection) -> None:
        self.conn = conn
        name = f'qpid-jms:coordinator:{uuid.uuid4().hex[:8]}'
        self.sender = conn.create_sender(None, name=name, options=[CoordinatorTarget()])
        self.link = self.sender.link

    def _request(self, body: Any, timeout: float = TIMEOUT) -> Any:
        self.conn.wait(lambda: self.link.credit > 0, timeout=TIMEOUT, msg='coordinator credit')
        delivery = self.link.delivery(uuid.uuid4().hex)
        self.link.send(Message(body=body).encode())
        self.link.advance()
        self.conn.wait(lambda: delivery.settled, timeout=timeout, msg='coordinator reply')
        return delivery

    def declare(self) -> bytes:
        delivery = self._request(Described(ulong(0x31), []))
        assert delivery.remote_state == DECLARED, delivery.remote_state
        return bytes(delivery.remote.data[0])

    def discharge(self, txn: bytes, *, fail: bool, timeout: float = TIMEOUT) -> Any:
        """Returns the settled delivery (remote_state ACCEPTED or REJECTED with a condition)."""
        return self._request(Described(ulong(0x32), [txn, fail]), timeout)


def send_in(conn: BlockingConnection, snd: BlockingSender, txn: bytes, body: Any) -> Any:
    """A transactional send (``body`` a Message, or the body of one); returns the broker's
    disposition state and data."""
    link = snd.link
    conn.wait(lambda: link.credit > 0, timeout=TIMEOUT, msg='credit')
    delivery = link.delivery(uuid.uuid4().hex)
    delivery.local.data = [txn]
    delivery.update(TRANSACTIONAL_STATE)
    link.send((body if isinstance(body, Message) else Message(body=body)).encode())
    link.advance()
    conn.wait(lambda: delivery.settled, timeout=TIMEOUT, msg='send disposition')
    return delivery


def accept_in(rcv: BlockingReceiver, txn: bytes) -> None:
    """Acknowledge the oldest received message inside ``txn`` (settled at once, as Qpid JMS)."""
    delivery = rcv.fetcher.unsettled.popleft()
    delivery.local.data = [txn, Described(ulong(ACCEPTED), [])]
    delivery.update(TRANSACTIONAL_STATE)
    delivery.settle()
