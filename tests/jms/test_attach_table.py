"""
Seed 000's twelve-row attach table, one test per row, driven with the attaches Qpid JMS sends.

Rows: source null or not x SHARED x GLOBAL x terminus durability. Each test checks the outcome
(accepted with a non-null source, or refused: null source then detach with the error), the
reply's source where it means something, and what Redis holds for the subscription: its
definition, scope, durability and consumers, or (non-shared non-durable rows) only a private
``nd:`` consumer group on the topic stream. Where seed and jms-amqp-facts disagree the facts win:
the offered capability is ``SHARED-SUBS`` (facts §10), re-attaching an idle durable subscription
joins it (§3.1), and a null-source lookup that finds the subscription always answers with a
source (§3.2). Rows 3 and 4 (GLOBAL without SHARED) are attaches Qpid JMS never sends; they are
reproduced as a plain AMQP client would send them.

proton-c cannot set a link's desired capabilities, so the null-source rows name the global
namespace with the ``|global`` link-name suffix Qpid JMS uses exactly when it desires
[shared, global] (facts §3.2).
"""

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from amqpclient import Capabilities, connect, nothing_more, sender
from jmswire import (
    JMS_DESIRED,
    SELECTOR,
    AttachAnswer,
    JmsSource,
    NullSource,
    StoredSubscriptions,
    attach_answer,
    capabilities_of,
    client_id,
    consumer_link_name,
    durable_detach,
    jms_connect,
    subscriber,
    take,
)
from processes import BrokerProcess, RedisServer
from proton import Message, Terminus, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection, BlockingReceiver

TOPIC = Capabilities('topic')
SHARED_DURABLE_GLOBAL = JmsSource('topic', 'shared', 'global', durable=True)


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[StoredSubscriptions]:
    s = StoredSubscriptions(redis_server.url)
    yield s
    s.close()


def publish(url: str, topic: str, bodies: list[object]) -> None:
    conn = connect(url)
    snd = sender(conn, topic, TOPIC)
    for body in bodies:
        snd.send(Message(body=body))
    conn.close()


def unique(prefix: str) -> str:
    return client_id(prefix)  # a global subscription name no other test uses


def offers_shared_subs(conn: BlockingConnection) -> bool:
    return 'SHARED-SUBS' in [str(c) for c in conn.conn.remote_offered_capabilities or []]


def check_accepted(
    rcv: BlockingReceiver,
    topic: str,
    *,
    has: set[str],
    lacks: set[str],
    durable: bool,
) -> None:
    """The reply source of an accepted subscriber attach (facts §2.1, §10)."""
    source = rcv.link.remote_source
    assert source.type == Terminus.SOURCE
    assert source.address == topic
    caps = capabilities_of(source)
    assert has <= caps, caps
    assert not caps & lacks, caps
    if durable:
        assert source.durability == Terminus.DELIVERIES
        assert source.expiry_policy == Terminus.EXPIRE_NEVER
    else:
        assert source.durability == Terminus.NONDURABLE
        assert source.expiry_policy == Terminus.EXPIRE_WITH_LINK


def check_refused(answer: AttachAnswer, condition: str) -> None:
    assert answer.source_null, 'a refusal answers with a null source'
    assert answer.closed, 'a refusal is followed by a detach'
    assert answer.condition == condition, answer


def check_definition(
    store: StoredSubscriptions, sub_id: str, expected: dict[str, str], replicas: list[str]
) -> None:
    definition = store.definition(sub_id)
    assert {k: definition.get(k) for k in expected} == expected
    assert store.indexed(sub_id)
    assert sorted(store.consumers(sub_id).values()) == sorted(replicas)
    assert sub_id in store.groups(expected['topic'])  # its messages: a group named by the id


def named_on(store: StoredSubscriptions, topic: str) -> set[str]:
    """Ids of indexed subscriptions whose definition is on ``topic``."""
    members = store.redis.hkeys(store.INDEX)
    return {i for i in members if store.definition(i).get('topic') == topic}


def check_private_group_only(store: StoredSubscriptions, topic: str, replica: str) -> None:
    groups = set(store.groups(topic))
    assert len(groups) == 1, groups
    assert next(iter(groups)).startswith(f'nd:{replica}:'), groups
    assert named_on(store, topic) == set()


def definition_fields(
    topic: str, *, shared: bool, durable: bool, scope: str, client: str, name: str
) -> dict[str, str]:
    return {
        'topic': topic,
        'selector': '',
        'no_local': '0',
        'shared': '1' if shared else '0',
        'durable': '1' if durable else '0',
        'scope': scope,
        'client': client,
        'name': name,
    }


# -- rows 1-8: a source is set -------------------------------------------------------------------


def test_row_01_plain_topic_consumer_gets_a_private_group_for_the_life_of_its_link(
    broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    """Not shared, not global, not durable: createConsumer(topic) with a ClientID."""
    conn = jms_connect(broker.url, client_id('row1'))
    assert offers_shared_subs(conn)
    rcv = subscriber(conn, address, consumer_link_name(address), JmsSource('topic'))
    check_accepted(rcv, address, has={'topic'}, lacks={'shared', 'global'}, durable=False)
    check_private_group_only(store, address, 'replica-a')
    publish(broker.url, address, ['m'])
    assert take(rcv, 1) == ['m']
    rcv.close()  # Qpid JMS closes a non-durable consumer: the subscription goes with the link
    store.eventually(lambda: store.groups(address) == {}, msg='private group deleted')
    conn.close()


def test_row_02_exclusive_durable_subscription_is_created_in_the_client_id_namespace(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    """Not shared, not global, durable: createDurableSubscriber(topic, 'sub') with ClientID C."""
    cid = client_id('row2')
    conn = jms_connect(broker.url, cid)
    assert offers_shared_subs(conn)
    rcv = subscriber(conn, address, 'sub', JmsSource('topic', durable=True))
    check_accepted(rcv, address, has={'topic'}, lacks={'shared', 'global'}, durable=True)
    sub_id = store.sub_id(True, 'client', cid, 'sub')
    fields = definition_fields(address, shared=False, durable=True, scope='client', client=cid,
                               name='sub')  # fmt: skip
    check_definition(store, sub_id, fields, ['replica-a'])
    assert not any(g.startswith('nd:') for g in store.groups(address))
    # it exists and is active: a second consumer of it is refused (facts §3.1), on any replica
    other = jms_connect(second_broker.url, cid, sole=False)
    check_refused(
        attach_answer(other, address, 'sub', JmsSource('topic', durable=True)),
        'amqp:resource-locked',
    )
    other.close()
    assert list(store.consumers(sub_id).values()) == ['replica-a']
    durable_detach(rcv)  # detach(closed=false): the subscription stays, without consumers
    store.eventually(lambda: store.consumers(sub_id) == {}, msg='consumer left')
    assert store.definition(sub_id)['durable'] == '1'
    assert store.indexed(sub_id)
    conn.close()


def test_row_03_global_without_shared_non_durable_is_a_plain_private_subscriber(
    broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    """Not shared, global, not durable (not a Qpid JMS attach): the same as row 1."""
    conn = jms_connect(broker.url)
    rcv = subscriber(conn, address, consumer_link_name(address), JmsSource('topic', 'global'))
    check_accepted(rcv, address, has={'topic'}, lacks={'shared'}, durable=False)
    check_private_group_only(store, address, 'replica-a')
    publish(broker.url, address, ['m'])
    assert take(rcv, 1) == ['m']
    conn.close()  # connection close, no per-link detach: the private group goes too
    store.eventually(lambda: store.groups(address) == {}, msg='private group deleted')


def test_row_04_global_exclusive_durable_subscription_is_named_by_the_whole_link_name(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    """Not shared, global, durable (not a Qpid JMS attach): a durable subscription in the
    global namespace, one consumer at a time."""
    name = unique('row4')
    conn = jms_connect(broker.url)
    rcv = subscriber(conn, address, name, JmsSource('topic', 'global', durable=True))
    check_accepted(rcv, address, has={'topic', 'global'}, lacks={'shared'}, durable=True)
    sub_id = store.sub_id(True, 'global', '*', name)
    fields = definition_fields(address, shared=False, durable=True, scope='global', client='',
                               name=name)  # fmt: skip
    check_definition(store, sub_id, fields, ['replica-a'])
    other = jms_connect(second_broker.url)  # another container: still the one global name
    check_refused(
        attach_answer(other, address, name, JmsSource('topic', 'global', durable=True)),
        'amqp:resource-locked',
    )
    other.close()
    durable_detach(rcv)
    store.eventually(lambda: store.consumers(sub_id) == {}, msg='consumer left')
    assert store.indexed(sub_id)
    conn.close()


def test_row_05_shared_volatile_subscription_in_the_client_id_namespace(
    broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    """Shared, not global, not durable: createSharedConsumer(topic, 's') with ClientID C, twice
    on the connection (links ``s|volatile1``, ``s|volatile2``)."""
    cid = client_id('row5')
    conn = jms_connect(broker.url, cid)
    one = subscriber(conn, address, 's|volatile1', JmsSource('topic', 'shared'))
    check_accepted(one, address, has={'topic', 'shared'}, lacks={'global'}, durable=False)
    two = subscriber(conn, address, 's|volatile2', JmsSource('topic', 'shared'))
    sub_id = store.sub_id(False, 'client', cid, 's')
    fields = definition_fields(address, shared=True, durable=False, scope='client', client=cid,
                               name='s')  # fmt: skip
    check_definition(store, sub_id, fields, ['replica-a', 'replica-a'])
    assert set(store.groups(address)) == {sub_id}
    one.close()
    store.eventually(lambda: len(store.consumers(sub_id)) == 1, msg='first consumer left')
    two.close()  # the last consumer: a volatile subscription goes with it
    store.eventually(lambda: store.definition(sub_id) == {}, msg='volatile subscription deleted')
    assert not store.indexed(sub_id)
    store.eventually(lambda: store.groups(address) == {}, msg='its group deleted')
    conn.close()


def test_row_06_shared_durable_subscription_in_the_client_id_namespace(
    broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    """Shared, not global, durable: createSharedDurableConsumer(topic, 's') with ClientID C,
    twice on the connection (links ``s``, ``s|2``)."""
    cid = client_id('row6')
    conn = jms_connect(broker.url, cid)
    source = JmsSource('topic', 'shared', durable=True)
    one = subscriber(conn, address, 's', source)
    check_accepted(one, address, has={'topic', 'shared'}, lacks={'global'}, durable=True)
    two = subscriber(conn, address, 's|2', source)
    sub_id = store.sub_id(True, 'client', cid, 's')
    fields = definition_fields(address, shared=True, durable=True, scope='client', client=cid,
                               name='s')  # fmt: skip
    check_definition(store, sub_id, fields, ['replica-a', 'replica-a'])
    assert store.ids_named('s') >= {sub_id}
    assert set(store.groups(address)) == {sub_id}
    durable_detach(one)
    durable_detach(two)
    store.eventually(lambda: store.consumers(sub_id) == {}, msg='consumers left')
    assert store.definition(sub_id)['shared'] == '1'  # kept with no consumer
    assert set(store.groups(address)) == {sub_id}
    publish(broker.url, address, ['old topic backlog'])
    # exists, no consumer, another topic (binding): replaced by a subscription on the new topic
    moved = f'{address}-moved'
    again = subscriber(conn, moved, 's', source)
    assert store.definition(sub_id)['topic'] == moved
    store.eventually(lambda: store.groups(address) == {}, msg='group on the old topic deleted')
    assert set(store.groups(moved)) == {sub_id}
    assert nothing_more(again)
    publish(broker.url, moved, ['new topic'])
    assert take(again, 1) == ['new topic']
    conn.close()


def test_row_07_shared_volatile_subscription_in_the_global_namespace(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    """Shared, global, not durable: createSharedConsumer(topic, name) without a ClientID on two
    connections, one per replica (both links ``name|global-volatile1``)."""
    name = unique('row7')
    link = f'{name}|global-volatile1'
    source = JmsSource('topic', 'shared', 'global')
    a, b = jms_connect(broker.url), jms_connect(second_broker.url)
    on_a = subscriber(a, address, link, source)
    check_accepted(on_a, address, has={'topic', 'shared', 'global'}, lacks=set(), durable=False)
    on_b = subscriber(b, address, link, source)
    check_accepted(on_b, address, has={'topic', 'shared', 'global'}, lacks=set(), durable=False)
    sub_id = store.sub_id(False, 'global', '*', name)
    fields = definition_fields(address, shared=True, durable=False, scope='global', client='',
                               name=name)  # fmt: skip
    check_definition(store, sub_id, fields, ['replica-a', 'replica-b'])
    assert store.ids_named(name) == {sub_id}
    a.close()
    b.close()
    store.eventually(lambda: store.definition(sub_id) == {}, msg='volatile subscription deleted')
    store.eventually(lambda: store.groups(address) == {}, msg='its group deleted')


def test_row_08_shared_durable_subscription_in_the_global_namespace(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    """Shared, global, durable: createSharedDurableConsumer(topic, name) without a ClientID on
    two connections, one per replica (both links ``name|global``)."""
    name = unique('row8')
    link = f'{name}|global'
    source = JmsSource('topic', 'shared', 'global', durable=True)
    a, b = jms_connect(broker.url), jms_connect(second_broker.url)
    on_a = subscriber(a, address, link, source)
    check_accepted(on_a, address, has={'topic', 'shared', 'global'}, lacks=set(), durable=True)
    on_b = subscriber(b, address, link, source)
    check_accepted(on_b, address, has={'topic', 'shared', 'global'}, lacks=set(), durable=True)
    sub_id = store.sub_id(True, 'global', '*', name)
    fields = definition_fields(address, shared=True, durable=True, scope='global', client='',
                               name=name)  # fmt: skip
    check_definition(store, sub_id, fields, ['replica-a', 'replica-b'])
    # it exists with consumers: asking for it with another selector is refused (facts §3.1)
    c = jms_connect(broker.url)
    other = JmsSource('topic', 'shared', 'global', durable=True, selector='x = 1')
    check_refused(attach_answer(c, address, link, other), 'amqp:resource-locked')
    c.close()
    assert store.definition(sub_id)['selector'] == ''
    durable_detach(on_a)
    b.close()  # connection close without a detach: a durable subscription stays
    store.eventually(lambda: store.consumers(sub_id) == {}, msg='consumers left')
    assert store.indexed(sub_id)
    assert set(store.groups(address)) == {sub_id}
    a.close()


def test_rows_01_to_08_on_a_topic_that_does_not_exist_are_refused_with_not_found(
    start_broker: Callable[..., BrokerProcess], store: StoredSubscriptions, address: str
) -> None:
    """The seed's premise: the topic ("exchange") must exist, else not-found; nothing stored."""
    strict = start_broker(env={'SHOAL_AUTO_CREATE_TOPICS': 'false'})
    name = unique('missing')
    cid_conn, conn = jms_connect(strict.url, client_id('missing')), jms_connect(strict.url)
    attaches = [
        (cid_conn, consumer_link_name(address), JmsSource('topic')),  # row 1
        (cid_conn, name, JmsSource('topic', durable=True)),  # row 2
        (conn, consumer_link_name(address), JmsSource('topic', 'global')),  # row 3
        (conn, name, JmsSource('topic', 'global', durable=True)),  # row 4
        (cid_conn, f'{name}|volatile1', JmsSource('topic', 'shared')),  # row 5
        (cid_conn, name, JmsSource('topic', 'shared', durable=True)),  # row 6
        (conn, f'{name}|global-volatile1', JmsSource('topic', 'shared', 'global')),  # row 7
        (conn, f'{name}|global', SHARED_DURABLE_GLOBAL),  # row 8
    ]
    for c, link, source in attaches:
        check_refused(attach_answer(c, address, link, source), 'amqp:not-found')
    assert store.ids_named(name) == set()
    assert store.groups(address) == {}
    cid_conn.close()
    conn.close()


# -- rows 9-12: a null source (Qpid JMS unsubscribe lookup) ----------------------------------------


def check_found(
    rcv: BlockingReceiver, topic: str, *, has: set[str], lacks: set[str]
) -> None:  # fmt: skip
    """A found subscription: a non-null source describing it (facts §3.2)."""
    source = rcv.link.remote_source
    assert source.type == Terminus.SOURCE
    assert source.address == topic
    assert source.durability == Terminus.DELIVERIES
    assert source.expiry_policy == Terminus.EXPIRE_NEVER
    caps = capabilities_of(source)
    assert has <= caps, caps
    assert not caps & lacks, caps


def lookup(conn: BlockingConnection, link_name: str) -> BlockingReceiver:
    return conn.create_receiver(None, name=link_name, options=[NullSource()])


def check_deleted_by_close(
    store: StoredSubscriptions, rcv: BlockingReceiver, sub_id: str, topic: str
) -> None:
    """detach(closed=true) on the lookup link deletes the subscription, answered with no error."""
    rcv.close()
    assert rcv.link.remote_condition is None
    assert store.definition(sub_id) == {}
    assert not store.indexed(sub_id)
    store.eventually(lambda: sub_id not in store.groups(topic), msg='its group deleted')


def test_row_09_lookup_in_the_client_id_namespace_finds_an_exclusive_durable_subscription(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    """Null source, not shared, not global: unsubscribe('sub') with ClientID C (link ``sub``)."""
    cid = client_id('row9')
    conn = jms_connect(broker.url, cid)
    source = JmsSource('topic', durable=True, selector="colour = 'red'")
    durable_detach(subscriber(conn, address, 'sub', source))
    sub_id = store.sub_id(True, 'client', cid, 'sub')
    stranger = jms_connect(second_broker.url, client_id('row9-other'))  # another ClientID
    check_refused(attach_answer(stranger, None, 'sub', NullSource()), 'amqp:not-found')
    stranger.close()
    found = lookup(conn, 'sub')
    check_found(found, address, has={'topic'}, lacks={'shared', 'global'})
    filters = found.link.remote_source.filter
    filters.rewind()
    filters.next()
    (selector,) = filters.get_object().values()  # the stored selector, as Qpid JMS encodes it
    assert (selector.descriptor, selector.value) == (SELECTOR, "colour = 'red'")
    assert store.consumers(sub_id) == {}  # a lookup is not a consumer
    check_deleted_by_close(store, found, sub_id, address)
    check_refused(attach_answer(conn, None, 'sub', NullSource()), 'amqp:not-found')
    conn.close()


def test_row_10_lookup_in_the_global_namespace_finds_a_non_shared_durable_subscription(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    """Null source, not shared, global: the subscription of row 4, looked up as ``name|global``
    (the only null-source attach that names the global namespace)."""
    name = unique('row10')
    conn = jms_connect(broker.url)
    durable_detach(subscriber(conn, address, name, JmsSource('topic', 'global', durable=True)))
    sub_id = store.sub_id(True, 'global', '*', name)
    # without |global the lookup is in this connection's own (generated) ClientID namespace
    check_refused(attach_answer(conn, None, name, NullSource()), 'amqp:not-found')
    other = jms_connect(second_broker.url)
    found = lookup(other, f'{name}|global')
    check_found(found, address, has={'topic', 'global'}, lacks={'shared'})
    check_deleted_by_close(store, found, sub_id, address)
    check_refused(attach_answer(other, None, f'{name}|global', NullSource()), 'amqp:not-found')
    other.close()
    conn.close()


def test_row_11_lookup_in_the_client_id_namespace_finds_a_shared_durable_subscription(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    """Null source, shared, not global: unsubscribe('s') with ClientID C after
    createSharedDurableConsumer (link ``s``, no desired capabilities: facts §3.2)."""
    cid = client_id('row11')
    name = unique('row11')  # a global namesake from other tests must not exist
    conn = jms_connect(broker.url, cid)
    durable_detach(subscriber(conn, address, name, JmsSource('topic', 'shared', durable=True)))
    sub_id = store.sub_id(True, 'client', cid, name)
    no_cid = jms_connect(second_broker.url)  # the global 's' is another subscription
    check_refused(attach_answer(no_cid, None, f'{name}|global', NullSource()), 'amqp:not-found')
    no_cid.close()
    found = lookup(conn, name)
    check_found(found, address, has={'topic', 'shared'}, lacks={'global'})
    check_deleted_by_close(store, found, sub_id, address)
    check_refused(attach_answer(conn, None, name, NullSource()), 'amqp:not-found')
    conn.close()


def test_row_12_lookup_in_the_global_namespace_finds_a_shared_durable_subscription(
    broker: BrokerProcess, second_broker: BrokerProcess, store: StoredSubscriptions, address: str
) -> None:
    """Null source, shared, global: unsubscribe(name) without a ClientID (link ``name|global``),
    from another connection on another replica than the one that made it."""
    name = unique('row12')
    source = JmsSource('topic', 'shared', 'global', durable=True)
    conn = jms_connect(broker.url)
    durable_detach(subscriber(conn, address, f'{name}|global', source))
    conn.close()
    sub_id = store.sub_id(True, 'global', '*', name)
    with_cid = jms_connect(broker.url, client_id('row12'))  # its namespace has no such name
    check_refused(attach_answer(with_cid, None, name, NullSource()), 'amqp:not-found')
    with_cid.close()
    other = jms_connect(second_broker.url)
    found = lookup(other, f'{name}|global')
    check_found(found, address, has={'topic', 'shared', 'global'}, lacks=set())
    check_deleted_by_close(store, found, sub_id, address)
    check_refused(attach_answer(other, None, f'{name}|global', NullSource()), 'amqp:not-found')
    publish(broker.url, address, ['after unsubscribe'])  # retained for nobody
    again = jms_connect(broker.url)
    fresh = subscriber(again, address, f'{name}|global', source)
    assert nothing_more(fresh)
    again.close()
    other.close()


# -- the same attach, pipelined with the Open ------------------------------------------------------


class _PipelinedAttach(MessagingHandler):  # type: ignore[misc]
    """Open, Begin and Attach written together, before the broker's Open arrives (what proton's
    Container and rhea do; Qpid JMS itself waits for the Open first)."""

    def __init__(self, url: str, topic: str, link_name: str, desired: list[str]) -> None:
        super().__init__(prefetch=0)
        self.url, self.topic, self.link_name, self.desired = url, topic, link_name, desired
        self.remote_source: str | None = None
        self.link_opened = False
        self._conn: Any = None
        self._timer: Any = None

    def on_start(self, event: Any) -> None:
        self._conn = event.container.connect(
            self.url,
            container_id=f'ID:{uuid.uuid4()}:1',
            desired_capabilities=[symbol(c) for c in self.desired] or None,
        )
        event.container.create_receiver(
            self._conn, self.topic, name=self.link_name, options=[SHARED_DURABLE_GLOBAL]
        )
        self._timer = event.container.schedule(3, self)

    def on_link_opened(self, event: Any) -> None:
        self.link_opened = True
        self.remote_source = event.link.remote_source.address
        self._timer.cancel()
        self._conn.close()

    def on_timer_task(self, event: Any) -> None:
        if self._conn is not None and not self.link_opened:
            self._conn.close()


def _pipelined(url: str, topic: str, desired: list[str]) -> _PipelinedAttach:
    handler = _PipelinedAttach(url, topic, f'{unique("pipe")}|global', desired)
    Container(handler).run()
    return handler


def test_row_08_attach_pipelined_with_the_open_of_a_plain_client_is_answered(
    broker: BrokerProcess, address: str
) -> None:
    handler = _pipelined(broker.url, address, [])
    assert handler.link_opened
    assert handler.remote_source == address


def test_row_08_attach_pipelined_with_the_open_of_a_sole_connection_client_is_answered(
    broker: BrokerProcess, address: str
) -> None:
    handler = _pipelined(broker.url, address, JMS_DESIRED)
    assert handler.link_opened
    assert handler.remote_source == address
