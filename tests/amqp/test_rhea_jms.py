"""
JMS subscriptions across two replicas, driven by rhea with hand-built JMS-style attaches.

The same scenarios as ``tests/jms/test_subscriptions.py``, but from an independent AMQP 1.0
implementation: ``tests/rhea/jms.js`` builds the Open, the consumer sources (capabilities, terminus
durability and expiry, distribution mode, described filters) and the unsubscribe lookups the way
Qpid JMS does (jms-amqp-facts §1.2, §1.5, §2, §3.2, §4), and runs a list of steps in one bounded
node process that prints one JSON line. Proton (``amqpclient``/``jmswire``) cross-checks.
"""

import json
import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from amqpclient import Capabilities, connect, nothing_more, sender
from jmswire import JmsSource, NullSource, jms_connect, subscriber
from processes import BrokerProcess
from proton import Message

RHEA_DIR = Path(__file__).resolve().parent.parent / 'rhea'
RUN_TIMEOUT_MS = 20_000

TOPIC = ['topic']
SHARED_GLOBAL = ['topic', 'shared', 'global']
ACCEPTED = 'accepted'


def run(*steps: dict[str, Any]) -> list[dict[str, Any]]:
    """Run ``steps`` in one rhea process; the result of each step, in order."""
    node = shutil.which('node')
    if node is None:
        pytest.fail('node is not installed: run `make node-deps` (make test installs it)')
    if not (RHEA_DIR / 'node_modules' / 'rhea').is_dir():
        pytest.fail(f'rhea is not installed in {RHEA_DIR / "node_modules"}: run `make node-deps`')
    done = subprocess.run(
        [node, 'jms.js', json.dumps({'timeout_ms': RUN_TIMEOUT_MS, 'steps': list(steps)})],
        cwd=RHEA_DIR,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_MS / 1000 + 10,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, f'jms.js printed {len(lines)} lines\n{done.stdout}\n{done.stderr}'
    result: dict[str, Any] = json.loads(lines[0])
    assert done.returncode == 0, f'jms.js exited {done.returncode}: {result}\n{done.stderr}'
    assert result['ok'] is True, result
    assert [r['op'] for r in result['steps']] == [s['op'] for s in steps]
    return list(result['steps'])


# -- steps (see tests/rhea/jms.js) ---------------------------------------------------------------


def open_conn(
    conn: str, broker: BrokerProcess, client_id: str | None = None, *, retry_ms: int = 0
) -> dict[str, Any]:
    step: dict[str, Any] = {'op': 'connect', 'conn': conn, 'port': broker.port}
    if client_id is not None:
        step['container_id'] = client_id
    if retry_ms:
        step['retry_ms'] = retry_ms
    return step


def attach(
    conn: str,
    name: str,
    address: str,
    caps: list[str],
    *,
    link: str | None = None,
    durable: bool = False,
    selector: str | None = None,
    credit: int = 10,
    accept: bool = True,
    wait: bool = True,
) -> dict[str, Any]:
    step: dict[str, Any] = {
        'op': 'attach', 'conn': conn, 'link': link or name, 'name': name, 'address': address,
        'caps': caps, 'durable': durable, 'credit': credit, 'accept': accept, 'no_wait': not wait,
    }  # fmt: skip
    if selector is not None:
        step['selector'] = selector
    return step


def attached(*links: str) -> dict[str, Any]:
    """Wait for the answers to attaches sent with ``wait=False``."""
    return {'op': 'attached', 'links': list(links)}


def lookup(
    conn: str, name: str, *, link: str | None = None, shared: bool = False
) -> dict[str, Any]:
    return {'op': 'lookup', 'conn': conn, 'name': name, 'link': link or name, 'global': shared}


def detach(link: str, *, closed: bool) -> dict[str, Any]:
    return {'op': 'detach', 'link': link, 'closed': closed}


def publish(
    conn: str, address: str, bodies: list[Any], properties: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    step: dict[str, Any] = {'op': 'publish', 'conn': conn, 'address': address, 'bodies': bodies}
    if properties is not None:
        step['properties'] = properties
    return step


def receive(*links: str, count: int, linger_ms: int = 300) -> dict[str, Any]:
    return {'op': 'receive', 'links': list(links), 'count': count, 'linger_ms': linger_ms}


def close(conn: str) -> dict[str, Any]:
    return {'op': 'close', 'conn': conn}


def found(result: dict[str, Any]) -> bool:
    """An attach or lookup the broker answered with a source and no refusing detach."""
    return bool(result['attached'] and result['source'] is not None and not result['detached'])


def refused_with(result: dict[str, Any], condition: str) -> bool:
    """The refusal of facts §2.1: attach with a null source, then detach carrying ``condition``."""
    return bool(
        result['source'] is None and result['error'] and result['error']['condition'] == condition
    )


def bodies(n: int, prefix: str = 'm') -> list[str]:
    return [f'{prefix}{i}' for i in range(n)]


def unique(prefix: str) -> str:
    return f'{prefix}-{uuid.uuid4().hex[:8]}'


# -- 1. shared durable, global ------------------------------------------------------------------


def test_a_global_shared_durable_subscription_on_two_replicas_splits_and_keeps_its_backlog(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    results = run(
        open_conn('a', broker),
        open_conn('b', second_broker),
        open_conn('p', broker),
        # prefetch 1, as facts §4.3 advises for a fair share between competing consumers
        attach('a', 's|global', address, SHARED_GLOBAL, link='on-a', durable=True, credit=1),
        attach('b', 's|global', address, SHARED_GLOBAL, link='on-b', durable=True, credit=1),
        publish('p', address, bodies(50)),
        receive('on-a', 'on-b', count=50, linger_ms=500),
        detach('on-a', closed=False),
        detach('on-b', closed=False),
        publish('p', address, bodies(5, 'later')),
        attach('b', 's|global', address, SHARED_GLOBAL, link='again', durable=True),
        receive('again', count=5),
        detach('again', closed=False),
        close('a'),
        close('b'),
        close('p'),
    )
    first, second = results[3], results[4]
    assert found(first), first
    assert found(second), second
    assert results[5]['outcomes'] == [ACCEPTED] * 50
    split = results[6]['received']
    assert sorted(split['on-a'] + split['on-b']) == sorted(bodies(50)), 'each exactly once'
    assert split['on-a'], 'both consumers take part'
    assert split['on-b'], 'both consumers take part'
    assert results[7] == {'op': 'detach', 'closed': False, 'error': None}
    assert results[8] == {'op': 'detach', 'closed': False, 'error': None}
    assert results[9]['outcomes'] == [ACCEPTED] * 5
    assert found(results[10])
    assert results[11]['received'] == {'again': bodies(5, 'later')}
    # proton joins the same global subscription: nothing was left behind or duplicated
    conn = jms_connect(broker.url)
    sub = subscriber(conn, address, 's|global', JmsSource(*SHARED_GLOBAL, durable=True))
    assert nothing_more(sub)
    conn.close()


def test_shared_durable_consumers_attaching_at_once_on_two_replicas_join_one_subscription(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    names = [f'race{i}|global' for i in range(5)]
    steps = [open_conn('a', broker), open_conn('b', second_broker), open_conn('p', broker)]
    for name in names:  # both attaches go out before either answer comes back
        for conn in ('a', 'b'):
            steps.append(
                attach(conn, name, address, SHARED_GLOBAL, link=f'{conn}:{name}', durable=True,
                       credit=1, wait=False)
            )  # fmt: skip
    links = [f'{conn}:{name}' for name in names for conn in ('a', 'b')]
    results = run(
        *steps,
        attached(*links),
        publish('p', address, bodies(10)),
        receive(*links, count=10 * len(names), linger_ms=500),
        close('a'),
        close('b'),
        close('p'),
    )
    answers = results[3 + len(links)]['links']
    assert all(found(answers[link]) for link in links), answers
    received = results[5 + len(links)]['received']
    for name in names:
        got = received[f'a:{name}'] + received[f'b:{name}']
        assert sorted(got) == sorted(bodies(10)), f'{name}: each message once per subscription'


def test_unsettled_deliveries_of_a_departing_shared_durable_consumer_go_back_to_the_subscription(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    results = run(
        open_conn('a', broker),
        open_conn('b', second_broker),
        attach('a', 'u|global', address, SHARED_GLOBAL, link='holds', durable=True, accept=False),
        publish('b', address, bodies(3)),
        receive('holds', count=3),
        detach('holds', closed=False),  # JMS consumer close with unacknowledged prefetch
        attach('b', 'u|global', address, SHARED_GLOBAL, link='next', durable=True),
        receive('next', count=3, linger_ms=500),
        close('a'),
        close('b'),
    )
    assert results[4]['received'] == {'holds': bodies(3)}
    assert results[4]['delivery_counts'] == {'holds': [0, 0, 0]}
    assert results[7]['received'] == {'next': bodies(3)}
    assert results[7]['delivery_counts'] == {'next': [1, 1, 1]}, 'JMSRedelivered'


# -- 2. exclusive durable with a ClientID -------------------------------------------------------


def test_an_exclusive_durable_subscription_resumes_on_the_other_replica_with_its_backlog(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    before = run(
        open_conn('c', broker, 'C'),
        attach('c', 'sub', address, TOPIC, durable=True),
        detach('sub', closed=False),
        close('c'),
    )
    assert not before[0]['refused'], before[0]
    assert found(before[1]), before[1]
    source = before[1]['source']
    assert source['address'] == address
    assert before[2] == {'op': 'detach', 'closed': False, 'error': None}
    # published with proton while nobody is attached
    pub = connect(broker.url)
    snd = sender(pub, address, Capabilities('topic'))
    for body in ('first', 'second', 'third'):
        snd.send(Message(body=body))
    pub.close()
    after = run(
        open_conn('c', second_broker, 'C'),
        attach('c', 'sub', address, TOPIC, durable=True),
        receive('sub', count=3),
        detach('sub', closed=False),
        close('c'),
    )
    assert not after[0]['refused'], after[0]
    assert found(after[1]), after[1]
    assert after[2]['received'] == {'sub': ['first', 'second', 'third']}


# -- 3. unsubscribe -----------------------------------------------------------------------------


def test_unsubscribe_finds_the_subscription_by_null_source_lookup_and_deletes_it(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    client_id = unique('rhea-unsub')
    results = run(
        open_conn('c', broker, client_id),
        attach('c', 'gone', address, TOPIC, durable=True),
        detach('gone', closed=False),
        lookup('c', 'gone', link='lookup-1'),
        detach('lookup-1', closed=True),  # the delete request
        lookup('c', 'gone', link='lookup-2'),
        close('c'),
    )
    assert found(results[1])
    assert found(results[3]), 'the lookup reply carries a non-null source'
    assert results[4] == {'op': 'detach', 'closed': True, 'error': None}
    assert refused_with(results[5], 'amqp:not-found'), results[5]
    # proton agrees, from the other replica
    conn = jms_connect(second_broker.url, client_id)
    with pytest.raises(Exception, match='amqp:not-found'):
        conn.create_receiver(None, name='gone', options=NullSource())
    conn.close()


def test_unsubscribe_of_a_missing_subscription_is_not_found(broker: BrokerProcess) -> None:
    missing = unique('never-made')
    results = run(
        open_conn('g', broker),
        lookup('g', f'{missing}|global', shared=True),
        open_conn('c', broker, unique('rhea-missing')),
        lookup('c', missing),
        close('g'),
        close('c'),
    )
    for result in (results[1], results[3]):
        assert refused_with(result, 'amqp:not-found'), result
        assert result['attached'], 'refused by attach(source=null) first, then the detach'
        assert result['detached']


def test_unsubscribe_is_resource_locked_while_a_consumer_is_active_on_the_other_replica(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    results = run(
        open_conn('busy', second_broker),
        attach('busy', 'busy|global', address, SHARED_GLOBAL, link='active', durable=True),
        open_conn('u', broker),
        lookup('u', 'busy|global', link='lookup-1', shared=True),
        detach('lookup-1', closed=True),
        publish('u', address, ['after the refused unsubscribe']),
        receive('active', count=1),
        detach('active', closed=False),  # the last consumer goes: unsubscribe may now succeed
        lookup('u', 'busy|global', link='lookup-2', shared=True),
        detach('lookup-2', closed=True),
        lookup('u', 'busy|global', link='lookup-3', shared=True),
        close('u'),
        close('busy'),
    )
    assert found(results[1])
    assert found(results[3])
    locked = results[4]
    assert locked['closed'] is True
    assert locked['error'] is not None, 'deleted a subscription with an active consumer'
    assert locked['error']['condition'] == 'amqp:resource-locked'
    assert results[5]['outcomes'] == [ACCEPTED]
    assert results[6]['received'] == {'active': ['after the refused unsubscribe']}
    assert found(results[8]), 'the refused unsubscribe kept the subscription'
    assert results[9] == {'op': 'detach', 'closed': True, 'error': None}
    assert refused_with(results[10], 'amqp:not-found'), results[10]


# -- 4. shared volatile -------------------------------------------------------------------------


def test_a_global_shared_volatile_subscription_is_shared_and_goes_with_its_last_consumer(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    name = 'v|global-volatile1'
    results = run(
        open_conn('a', broker),
        open_conn('b', second_broker),
        open_conn('p', broker),
        # prefetch 1, as facts §4.3 advises for a fair share between competing consumers
        attach('a', name, address, SHARED_GLOBAL, link='on-a', credit=1),
        attach('b', name, address, SHARED_GLOBAL, link='on-b', credit=1),
        publish('p', address, bodies(30)),
        receive('on-a', 'on-b', count=30, linger_ms=500),
        detach('on-a', closed=True),
        detach('on-b', closed=True),
        publish('p', address, bodies(3, 'unseen')),
        attach('a', name, address, SHARED_GLOBAL, link='again'),
        receive('again', count=0, linger_ms=700),
        close('a'),
        close('b'),
        close('p'),
    )
    assert found(results[3])
    assert found(results[4])
    assert results[5]['outcomes'] == [ACCEPTED] * 30
    split = results[6]['received']
    assert sorted(split['on-a'] + split['on-b']) == sorted(bodies(30)), 'each exactly once'
    assert split['on-a'], 'both consumers take part'
    assert split['on-b'], 'both consumers take part'
    assert results[7] == {'op': 'detach', 'closed': True, 'error': None}
    assert results[8] == {'op': 'detach', 'closed': True, 'error': None}
    assert results[9]['outcomes'] == [ACCEPTED] * 3
    assert found(results[10])
    assert results[11]['received'] == {'again': []}, 'nothing retained for a volatile sub'


# -- 5. selectors -------------------------------------------------------------------------------


def test_a_selector_sent_as_a_described_filter_filters_a_subscription(
    broker: BrokerProcess, address: str
) -> None:
    colours = ['red', 'blue', 'red', 'green', 'red']
    results = run(
        open_conn('a', broker),
        attach(
            'a',
            'reds|global',
            address,
            SHARED_GLOBAL,
            durable=True,
            selector="colour = 'red' AND n > 0",
        ),
        publish(
            'a',
            address,
            bodies(len(colours)),
            [{'colour': c, 'n': i} for i, c in enumerate(colours)],
        ),
        receive('reds|global', count=2, linger_ms=500),
        detach('reds|global', closed=False),
        close('a'),
    )
    assert found(results[1]), results[1]
    assert results[2]['outcomes'] == [ACCEPTED] * len(colours)
    assert results[3]['received'] == {'reds|global': ['m2', 'm4']}
    assert results[3]['properties'] == {
        'reds|global': [{'colour': 'red', 'n': 2}, {'colour': 'red', 'n': 4}]
    }


def test_a_selector_applies_to_what_a_detached_durable_subscription_keeps(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    client_id = unique('rhea-selector')
    colours = ['red', 'blue', 'red', 'blue']
    results = run(
        open_conn('c', broker, client_id),
        attach('c', 'reds', address, TOPIC, durable=True, selector="colour = 'red'"),
        detach('reds', closed=False),
        open_conn('p', second_broker),
        publish('p', address, bodies(4), [{'colour': c} for c in colours]),
        attach('c', 'reds', address, TOPIC, link='again', durable=True, selector="colour = 'red'"),
        receive('again', count=2, linger_ms=500),
        close('p'),
        close('c'),
    )
    assert found(results[1])
    assert results[4]['outcomes'] == [ACCEPTED] * 4
    assert found(results[5])
    assert results[6]['received'] == {'again': ['m0', 'm2']}


def test_a_bad_selector_is_refused_with_invalid_field(broker: BrokerProcess, address: str) -> None:
    results = run(
        open_conn('a', broker, unique('rhea-bad-selector')),
        attach('a', 'bad', address, TOPIC, durable=True, selector='colour = = 1'),
        attach('a', 'bad|global-volatile1', address, SHARED_GLOBAL, selector="a LIKE 'x' ESCAPE"),
        close('a'),
    )
    for result in results[1:3]:
        assert result['attached'], 'answered with an attach (source=null) first'
        assert refused_with(result, 'amqp:invalid-field'), result
        assert result['detached']


# -- 6. ClientID uniqueness ---------------------------------------------------------------------


def assert_refused_as_qpid_jms_expects(result: dict[str, Any]) -> None:
    """facts §1.5: an Open carrying amqp:connection-establishment-failed, then a Close with
    amqp:invalid-field and info {invalid-field: container-id}; nothing else."""
    assert result['opened'], f'the refusal starts with an Open (Qpid JMS waits for it): {result}'
    assert result['refused'], result
    assert [e['frame'] for e in result['events']] == ['open', 'close'], result
    open_frame, close_frame = result['events']
    assert open_frame['properties']['amqp:connection-establishment-failed'] is True
    assert close_frame['error']['condition'] == 'amqp:invalid-field'
    assert close_frame['error']['info'] == {'invalid-field': 'container-id'}


def test_a_second_connection_with_the_same_client_id_is_refused_the_way_qpid_jms_expects(
    broker: BrokerProcess, second_broker: BrokerProcess, address: str
) -> None:
    results = run(
        open_conn('first', broker, 'dup'),
        open_conn('second', second_broker, 'dup'),
        open_conn('same-replica', broker, 'dup'),
        attach('first', f'qpid-jms:receiver:ID:1:1:1:1:{address}', address, TOPIC, link='t'),
        publish('first', address, ['still works']),
        receive('t', count=1),
        close('first'),
        # retried for robustness; the broker now releases the ClientID before answering Close
        open_conn('third', second_broker, 'dup', retry_ms=3000),
        close('third'),
    )
    first, third = results[0], results[7]
    assert first['opened']
    assert not first['refused'], first
    assert_refused_as_qpid_jms_expects(results[1])
    assert_refused_as_qpid_jms_expects(results[2])
    assert found(results[3])
    assert results[4]['outcomes'] == [ACCEPTED]
    assert results[5]['received'] == {'t': ['still works']}
    assert results[6] == {'op': 'close', 'error': None}
    assert third['opened']
    assert not third['refused'], f'"dup" is free once its connection closed: {third}'


def test_a_client_id_held_by_proton_is_refused_to_rhea_until_proton_closes(
    broker: BrokerProcess, second_broker: BrokerProcess
) -> None:
    held_by_proton = unique('proton-holds')
    conn = jms_connect(broker.url, held_by_proton)
    results = run(open_conn('r', second_broker, held_by_proton))
    assert_refused_as_qpid_jms_expects(results[0])
    conn.close()
    assert not run(open_conn('r', second_broker, held_by_proton), close('r'))[0]['refused']


# -- regressions: ClientID release timing and Redis connection bursts ----------------------------


def attach_many(
    conn: str, names: list[str], address: str, caps: list[str], *, batch: int
) -> list[dict[str, Any]]:
    """Attach one consumer per name, ``batch`` attaches in flight at a time."""
    steps: list[dict[str, Any]] = []
    for i in range(0, len(names), batch):
        group = names[i : i + batch]
        steps += [attach(conn, name, address, caps, wait=False) for name in group]
        steps.append(attached(*group))
    return steps


def attach_answers(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    answers: dict[str, dict[str, Any]] = {}
    for result in results:
        if result['op'] == 'attached':
            answers.update(result['links'])
    return answers


def test_a_client_id_is_free_as_soon_as_the_broker_has_answered_its_close(
    start_broker: Callable[..., BrokerProcess], address: str
) -> None:
    one, other = start_broker(), start_broker()
    for round_ in range(3):  # each round loses the race most of the time; all three, hardly ever
        client_id = unique(f'rhea-quick-{round_}')
        names = [f'v{i}|volatile1' for i in range(80)]  # store work on close widens the window
        results = run(
            open_conn('c', one, client_id),
            *attach_many('c', names, f'{address}-{round_}', ['topic', 'shared'], batch=40),
            close('c'),
            open_conn('again', other, client_id),  # right after close() returned
            close('again'),
        )
        assert all(found(a) for a in attach_answers(results).values())
        again = results[-2]
        assert not again['refused'], f'round {round_}: {again["events"]}'


def test_a_burst_of_attaches_on_one_replica_is_not_refused(
    start_broker: Callable[..., BrokerProcess], address: str
) -> None:
    replica = start_broker()
    names = [f'burst{i}|global-volatile1' for i in range(200)]
    steps = [open_conn(f'c{i}', replica) for i in range(4)]  # four clients at once, e.g. after
    for i in range(4):  # a failover
        group = names[i * 50 : (i + 1) * 50]
        steps += [attach(f'c{i}', name, address, SHARED_GLOBAL, wait=False) for name in group]
    results = run(*steps, attached(*names), *[close(f'c{i}') for i in range(4)])
    refused = {n: a['error'] for n, a in attach_answers(results).items() if not found(a)}
    assert not refused, f'{len(refused)} of 200 refused, e.g. {next(iter(refused.values()))}'


def test_a_client_id_is_released_after_closing_a_connection_with_many_consumers(
    start_broker: Callable[..., BrokerProcess], address: str
) -> None:
    one, other = start_broker(), start_broker()
    client_id = unique('rhea-many')
    names = [f'v{i}|volatile1' for i in range(150)]
    results = run(
        open_conn('c', one, client_id),
        *attach_many('c', names, address, ['topic', 'shared'], batch=25),
        close('c'),
        open_conn('again', other, client_id, retry_ms=3000),
        close('again'),
    )
    answers = attach_answers(results)
    assert all(found(a) for a in answers.values()), 'precondition: every consumer attached'
    again = results[-2]
    assert not again['refused'], f'still refused after {again["attempts"]} tries in 3 s'


def test_shared_volatile_subscriptions_go_with_a_connection_that_had_many_consumers(
    start_broker: Callable[..., BrokerProcess], address: str
) -> None:
    one, other = start_broker(), start_broker()
    names = [f'vol{i}|global-volatile1' for i in range(150)]
    results = run(
        open_conn('c', one),
        *attach_many('c', names, address, SHARED_GLOBAL, batch=25),
        close('c'),
        open_conn('p', other),
        publish('p', address, ['after the last consumer left']),
        open_conn('d', other),
        *attach_many('d', names, address, SHARED_GLOBAL, batch=25),
        receive(*names, count=0, linger_ms=700),
        close('d'),
        close('p'),
    )
    answers = [r for r in results if r['op'] == 'attached']
    before, after = answers[: len(answers) // 2], answers[len(answers) // 2 :]
    assert all(found(a) for a in attach_answers(before).values()), 'precondition'
    assert all(found(a) for a in attach_answers(after).values())
    kept = {name: got for name, got in results[-3]['received'].items() if got}
    assert not kept, f'{len(kept)} of 150 volatile subscriptions survived and kept a message'
