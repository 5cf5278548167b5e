"""
What Qpid JMS puts on the wire, reproduced with proton's client (jms-amqp-facts §1.2, §2, §3.2).

The real Qpid JMS client needs Maven Central, which this workplace cannot reach, so tests drive
the broker with the exact attaches the client sends: container-id = ClientID, the four desired
connection capabilities, and per consumer type the link name, source capabilities, terminus
durability and expiry, distribution mode and filters.
"""

import uuid
from typing import Any

from proton import Array, Data, Described, Link, Terminus, symbol, ulong
from proton.reactor import Container, LinkOption
from proton.utils import BlockingConnection, BlockingReceiver

JMS_DESIRED = [
    'sole-connection-for-container',
    'DELAYED_DELIVERY',
    'ANONYMOUS-RELAY',
    'SHARED-SUBS',
]
SELECTOR = ulong(0x0000468C00000004)
NO_LOCAL = ulong(0x0000468C00000003)
TIMEOUT = 10


def jms_connect(url: str, client_id: str | None = None, *, sole: bool = True) -> BlockingConnection:
    """A connection as Qpid JMS opens it; without a ClientID the container-id is generated.

    ``sole=False`` leaves out the desired capabilities, as a non-JMS client with the same
    container-id would, so the broker does not enforce ClientID uniqueness for it.
    """
    container = Container()
    container.container_id = client_id or f'ID:{uuid.uuid4()}:1'
    desired = [symbol(c) for c in JMS_DESIRED] if sole else None
    return BlockingConnection(
        url, timeout=TIMEOUT, container=container, desired_capabilities=desired
    )


class JmsSource(LinkOption):
    """A consumer source as Qpid JMS builds it (facts §2.1 and the §2.2 table)."""

    def __init__(
        self,
        *capabilities: str,
        durable: bool = False,
        selector: str | None = None,
        no_local: bool = False,
    ) -> None:
        self.capabilities = capabilities
        self.durable = durable
        self.selector = selector
        self.no_local = no_local

    def apply(self, link: Link) -> None:
        source = link.source
        source.capabilities.put_object(
            Array(Data.NULL, Data.SYMBOL, *[symbol(c) for c in self.capabilities])
        )
        if self.durable:
            source.durability = Terminus.DELIVERIES
            source.expiry_policy = Terminus.EXPIRE_NEVER
            source.distribution_mode = Terminus.DIST_MODE_COPY
        else:
            source.durability = Terminus.NONDURABLE
            source.expiry_policy = Terminus.EXPIRE_WITH_LINK
        filters: dict[Any, Any] = {}
        if self.selector is not None:
            filters[symbol('jms-selector')] = Described(SELECTOR, self.selector)
        if self.no_local:
            filters[symbol('no-local')] = Described(NO_LOCAL, 'NoLocalFilter{}')
        if filters:
            source.filter.put_dict(filters)


class NullSource(LinkOption):
    """The unsubscribe lookup link: no source at all (facts §3.2)."""

    def apply(self, link: Link) -> None:
        link.source.type = Terminus.UNSPECIFIED


def subscriber(
    conn: BlockingConnection, topic: str, link_name: str, source: JmsSource, credit: int = 10
) -> BlockingReceiver:
    return conn.create_receiver(topic, credit=credit, name=link_name, options=[source])


def durable_detach(rcv: BlockingReceiver) -> None:
    """Qpid JMS closes a durable consumer with detach(closed=false).

    proton raises no state change for a non-closing detach, so wait for a later round trip
    instead (the broker handles frames in order): attach and close a throwaway link.
    """
    rcv.link.detach()
    probe = rcv.connection.create_sender(None, name=f'probe-{uuid.uuid4().hex[:8]}')
    probe.close()
