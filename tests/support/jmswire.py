"""
What Qpid JMS puts on the wire, reproduced with proton's client (jms-amqp-facts §1.2, §2, §3.2).

The real Qpid JMS client needs Maven Central, which this workplace cannot reach, so tests drive
the broker with the exact attaches the client sends: container-id = ClientID, the four desired
connection capabilities, and per consumer type the link name, source capabilities, terminus
durability and expiry, distribution mode and filters.
"""

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from proton import (
    Array,
    Data,
    Described,
    Endpoint,
    Handler,
    Link,
    Receiver,
    Terminus,
    Timeout,
    symbol,
    ulong,
)
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
    """Qpid JMS closes a durable consumer with detach(closed=false) and waits for the answering
    detach: an unsubscribe may follow at once, attaching a link of the same name.

    proton changes no endpoint state for a non-closing detach, so the answer is caught as the
    link's remote-detach event, on its handler. (A later round trip on a throwaway link, used
    before, is not the same: the broker answers this detach only once the consumer has left the
    subscription, and may answer the throwaway link first.)
    """
    answered: list[bool] = []
    setattr(rcv.fetcher, 'on_link_remote_detach', lambda event: answered.append(True))  # noqa: B010
    rcv.link.detach()
    rcv.connection.wait(lambda: bool(answered), msg='the answering detach')


# -- additions: naming, refusals, the reply's source, the stored subscription ----------------------


def client_id(prefix: str) -> str:
    """A ClientID unique to this test run (the brokers live for the whole session)."""
    return f'{prefix}-{uuid.uuid4().hex[:8]}'


def consumer_link_name(address: str) -> str:
    """The link name Qpid JMS gives a consumer that names no subscription (facts §2.1)."""
    return f'qpid-jms:receiver:ID:{uuid.uuid4()}:1:1:1:{address}'


def capabilities_of(terminus: Terminus) -> set[str]:
    """A terminus' capabilities as plain strings (a single symbol or an array of them)."""
    data = terminus.capabilities
    data.rewind()
    if data.next() is None:
        return set()
    value = data.get_object()
    items = value.elements if isinstance(value, Array) else [value]
    return {str(item) for item in items}


@dataclasses.dataclass
class AttachAnswer:
    """How the broker answered a receiver attach, read without the blocking client's checks."""

    link: Receiver
    source_null: bool
    closed: bool
    condition: str | None
    description: str | None


def attach_answer(
    conn: BlockingConnection,
    address: str | None,
    link_name: str,
    option: LinkOption,
    *,
    settle: float = 0.3,
) -> AttachAnswer:
    """Attach a receiver and report the answer: its source, and whether a detach with an error
    followed (a refusal: null source, then detach(closed=true) with the condition, facts §2.1).

    An accepted link (non-null source) is watched for ``settle`` seconds for a late detach,
    then left open; the caller closes it.
    """
    link = conn.container.create_receiver(
        conn.conn, address, name=link_name, handler=Handler(), options=[option]
    )
    conn.wait(lambda: not link.state & Endpoint.REMOTE_UNINIT, msg=f'attach of {link_name}')
    source_null = link.remote_source.type == Terminus.UNSPECIFIED
    try:
        conn.wait(
            lambda: bool(link.state & Endpoint.REMOTE_CLOSED),
            timeout=TIMEOUT if source_null else settle,
        )
    except Timeout:
        pass
    closed = bool(link.state & Endpoint.REMOTE_CLOSED)
    condition = link.remote_condition
    answer = AttachAnswer(
        link=link,
        source_null=source_null,
        closed=closed,
        condition=condition.name if condition else None,
        description=condition.description if condition else None,
    )
    if closed:
        link.close()
        flush_connection(conn)
    return answer


def flush_connection(conn: BlockingConnection) -> None:
    """Write out what the blocking client has queued (dispositions, flow) without blocking:
    ``container.process()`` waits up to the container's timeout when there is no I/O."""
    saved = conn.container.timeout
    conn.container.timeout = 0.01
    try:
        for _ in range(3):
            conn.container.process()
    finally:
        conn.container.timeout = saved


def take(rcv: BlockingReceiver, count: int, timeout: float = TIMEOUT) -> list[Any]:
    """Receive and accept ``count`` messages; their bodies."""
    out = []
    for _ in range(count):
        out.append(rcv.receive(timeout=timeout).body)
        rcv.accept()
    flush_connection(rcv.connection)
    return out


def collect(
    receivers: list[BlockingReceiver], total: int, timeout: float = TIMEOUT
) -> list[list[Any]]:
    """Receive and accept ``total`` message bodies over several receivers (on one or several
    connections), polling each in turn so every connection's I/O keeps moving; returns the
    bodies per receiver. Stops early at the deadline, so a shortfall shows in the result."""
    got: list[list[Any]] = [[] for _ in receivers]
    deadline = time.monotonic() + timeout
    while sum(len(g) for g in got) < total and time.monotonic() < deadline:
        for i, rcv in enumerate(receivers):
            try:
                message = rcv.receive(timeout=0.05)
            except Timeout:
                continue
            rcv.accept()
            got[i].append(message.body)
    for rcv in receivers:
        flush_connection(rcv.connection)
    return got


class StoredSubscriptions:
    """Reads the Redis layout of named subscriptions and topic consumer groups (store/keys.py):
    the definition HASH ``shoal:{s:<id>}:def``, the consumers HASH ``shoal:{s:<id>}:consumers``,
    the index HASH ``shoal:subscription-index`` (id -> epoch) and the consumer groups of
    ``shoal:{a:<topic>}:p:5``."""

    INDEX = 'shoal:subscription-index'

    def __init__(self, url: str) -> None:
        self.redis = redis.Redis.from_url(url, decode_responses=True)

    def close(self) -> None:
        self.redis.close()

    @staticmethod
    def sub_id(durable: bool, scope: str, owner: str, name: str) -> str:
        """``<durable|volatile>:<client|global>:<clientid or *>:<name>``."""
        return f'{"durable" if durable else "volatile"}:{scope}:{owner}:{name}'

    def definition(self, subscription_id: str) -> dict[str, str]:
        return dict(self.redis.hgetall(f'shoal:{{s:{subscription_id}}}:def'))

    def consumers(self, subscription_id: str) -> dict[str, str]:
        """Consumer key -> replica id, cluster-wide."""
        return dict(self.redis.hgetall(f'shoal:{{s:{subscription_id}}}:consumers'))

    def indexed(self, subscription_id: str) -> bool:
        return bool(self.redis.hexists(self.INDEX, subscription_id))

    def ids_named(self, name: str) -> set[str]:
        """Every indexed subscription id whose name is ``name``."""
        return {i for i in self.redis.hkeys(self.INDEX) if i.rsplit(':', 1)[-1] == name}

    def groups(self, topic: str) -> dict[str, dict[str, Any]]:
        """Consumer groups on the topic's normal-priority stream, by name (empty if no stream)."""
        stream = f'shoal:{{a:{topic}}}:p:5'
        if not self.redis.exists(stream):
            return {}
        return {g['name']: g for g in self.redis.xinfo_groups(stream)}

    def eventually(
        self, check: Callable[[], bool], timeout: float = 5.0, msg: str = 'condition'
    ) -> None:
        """Wait for background store work (leaves and deletes run after the detach answer)."""
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f'not reached within {timeout}s: {msg}')
            time.sleep(0.05)
