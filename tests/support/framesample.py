"""
Valid AMQP frame streams from proton's client, the raw material for hostile input (the fuzz
harness's ``frames`` target and the live-broker robustness test mutate and truncate them).
"""

from proton import Connection, Message, Transport


def client_frames() -> list[bytes]:
    """A client's Open, Begin, Attach (both roles), Flow, Transfer, Detach, End, Close as
    proton writes them (without the protocol header)."""
    transport = Transport()
    connection = Connection()
    transport.bind(connection)
    connection.container = 'fuzz'
    connection.open()
    session = connection.session()
    session.open()
    sender = session.sender('fuzz-sender')
    sender.target.address = 'q'
    sender.open()
    receiver = session.receiver('fuzz-receiver')
    receiver.source.address = 'q'
    receiver.open()
    receiver.flow(10)
    opening = bytes(transport.peek(transport.pending()))
    transport.pop(len(opening))
    delivery = sender.delivery(b'tag')
    sender.stream(Message(body='x' * 50, properties={'a': 1}).encode())
    delivery.settle()
    sender.close()
    session.close()
    connection.close()
    closing = bytes(transport.peek(transport.pending()))
    header = b'AMQP\x00\x01\x00\x00'
    return [opening.removeprefix(header), opening.removeprefix(header) + closing]
