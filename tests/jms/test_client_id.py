"""ClientID uniqueness cluster-wide (sole-connection-for-container, jms-amqp-facts §1.5)."""

import time

from amqpclient import receive_all, receiver, sender
from enginepeer import EnginePeer
from jmswire import JMS_DESIRED, jms_connect
from processes import BrokerProcess
from proton import Message, symbol


def _jms_peer(port: int, client_id: str) -> EnginePeer:
    peer = EnginePeer(port)
    peer.connection.container = client_id
    peer.connection.desired_capabilities = [symbol(c) for c in JMS_DESIRED]
    peer.connection.open()
    return peer


def test_a_second_connection_with_the_same_client_id_is_refused_exactly_as_qpid_jms_expects(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    first = jms_connect(broker.url, 'unique-c')
    clash = _jms_peer(second_broker.port, 'unique-c')  # on the other replica
    assert clash.pump(5, until=lambda: clash.remote_closed)
    assert clash.connection.remote_properties[symbol('amqp:connection-establishment-failed')]
    condition = clash.connection.remote_condition
    assert condition.name == 'amqp:invalid-field'
    assert condition.info == {symbol('invalid-field'): symbol('container-id')}
    clash.close()
    sender(first, address).send(Message(body='the first keeps working'))
    assert receive_all(receiver(first, address, credit=1), 1)[0].body == 'the first keeps working'
    first.close()


def test_the_claim_is_released_when_the_connection_ends(
    broker: BrokerProcess, second_broker: BrokerProcess
) -> None:
    first = jms_connect(broker.url, 'released-c')
    first.close()
    deadline = time.monotonic() + 5
    while True:
        peer = _jms_peer(second_broker.port, 'released-c')
        answered = peer.pump(5, until=lambda p=peer: p.remote_open or p.remote_closed)
        assert answered
        if peer.remote_open and not peer.remote_closed:
            break
        peer.close()
        assert time.monotonic() < deadline, 'the claim was never released'
        time.sleep(0.1)
    assert (
        peer.connection.remote_properties.get(symbol('amqp:connection-establishment-failed'))
        is None
    )
    peer.close()


def test_connections_without_sole_connection_are_not_restricted(broker: BrokerProcess) -> None:
    holder = jms_connect(broker.url, 'shared-container')
    other = jms_connect(broker.url, 'shared-container', sole=False)
    assert other.conn.state & other.conn.REMOTE_ACTIVE
    other.close()
    holder.close()
