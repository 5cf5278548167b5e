"""
What the broker's routing parse (``codec.parse``) costs per message, for the shapes that reach it:
the load generator's bare 1 KiB data message, and a Qpid JMS TextMessage as the client writes it
(header, the two byte message annotations, message-id / to / creation-time; jms-amqp-facts §5.3-5.5)
with and without application properties. The load generator's messages carry no annotations or
properties, so bench/run.sh and peers.sh do not show this cost; JMS traffic pays it per message.

usage: .venv/bin/python bench/parse.py [--tree broker/] [--n 100000]
"""

import argparse
import sys
import timeit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--tree', default='broker', help='source root holding shoal_broker')
    parser.add_argument('--n', type=int, default=100_000, help='parses per shape')
    args = parser.parse_args()
    sys.path.insert(0, args.tree)
    from proton import Message, byte, symbol

    from shoal_broker.amqp import codec

    def jms_text(properties: dict[str, object] | None) -> bytearray:
        message = Message(
            body='x' * 1024, durable=True, address='orders', creation_time=1763700000.123,
            id='ID:7d2f1c3e-8c4b-4b1e-9a51-3f6d2b7c9e10:1:1:1-1', properties=properties,
        )  # fmt: skip
        message.annotations = {
            symbol('x-opt-jms-msg-type'): byte(5), symbol('x-opt-jms-dest'): byte(0)
        }  # fmt: skip
        return bytearray(message.encode())

    bare = Message(body=b'x' * 1024)
    bare.inferred = True  # a data section, as bench/load.py sends
    shapes = {
        'bench 1 KiB data': bytearray(bare.encode()),
        'Qpid JMS TextMessage 1 KiB': jms_text(None),
        'Qpid JMS TextMessage 1 KiB, 3 properties': jms_text(
            {'region': 'eu', 'priority': 7, 'retry': False}
        ),
    }
    print(f'codec.parse from {args.tree}, {args.n} parses each')
    for name, buf in shapes.items():
        seconds = min(timeit.repeat(lambda b=buf: codec.parse(b), number=args.n, repeat=3))
        print(f'  {name:45s} {seconds / args.n * 1e6:6.2f} µs')


if __name__ == '__main__':
    main()
