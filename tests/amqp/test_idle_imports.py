"""
What an idle broker leaves out (docs/performance.md, "Idle memory"): aiohttp until a request
that is not a probe, lark until a first selector, scramp without a users file, and
OpenTelemetry's metrics SDK always (redis-py would import it: ``store/__init__.py``). Each
feature still works when it is first used (the HTTP port's front: test_http_front.py).

A broker process lists the modules it imported when it exits (a ``sitecustomize`` put on its
``PYTHONPATH`` registers the listing), so what is checked is the real process after real use.
"""

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from amqpclient import connect, receiver, sender
from jmswire import SELECTOR
from processes import BrokerProcess
from proton import Described, Message, symbol
from proton.reactor import Filter

HEAVY = ('aiohttp', 'lark', 'scramp', 'opentelemetry.sdk.metrics')

_SITECUSTOMIZE = """
import atexit, json, os, sys

def _list_modules():
    with open(os.environ['SHOAL_TEST_MODULES_OUT'], 'w') as out:
        json.dump(sorted(sys.modules), out)

atexit.register(_list_modules)
"""


@pytest.fixture
def listed_broker(
    tmp_path: Path, start_broker: Callable[..., BrokerProcess]
) -> Callable[[], tuple[BrokerProcess, Callable[[], set[str]]]]:
    """Starts a broker that lists its imported modules on exit; the second callable stops it
    and returns which of HEAVY it imported."""
    site = tmp_path / 'site'
    site.mkdir()
    (site / 'sitecustomize.py').write_text(textwrap.dedent(_SITECUSTOMIZE))
    out = tmp_path / 'modules.json'
    path = os.pathsep.join(p for p in (str(site), os.environ.get('PYTHONPATH', '')) if p)
    env = {'PYTHONPATH': path, 'SHOAL_TEST_MODULES_OUT': str(out)}

    def start() -> tuple[BrokerProcess, Callable[[], set[str]]]:
        broker = start_broker(env=env)

        def heavy_after_stop() -> set[str]:
            assert broker.stop() == 0
            modules = set(json.loads(out.read_text()))
            return {name for name in HEAVY if name in modules}

        return broker, heavy_after_stop

    return start


def _selector(text: str) -> Filter:
    return Filter({symbol('jms-selector'): Described(SELECTOR, text)})


def test_a_broker_serving_probes_and_messages_imports_none_of_the_heavy_modules(
    listed_broker: Any, address: str
) -> None:
    broker, heavy_after_stop = listed_broker()
    assert broker.http_get('/livez') == (200, b'ok\n')
    assert broker.http_get('/readyz')[0] == 200
    status, body = broker.http_get('/metrics')
    assert status == 200
    assert b'# TYPE' in body
    conn = connect(broker.url)
    sender(conn, address).send(Message(body='plain'))
    assert receiver(conn, address).receive(timeout=10).body == 'plain'
    conn.close()
    assert heavy_after_stop() == set()


def test_a_selector_and_the_console_work_on_first_use_and_import_what_they_need(
    listed_broker: Any, address: str
) -> None:
    broker, heavy_after_stop = listed_broker()
    conn = connect(broker.url)
    rcv = receiver(conn, address, _selector("colour = 'red'"))
    snd = sender(conn, address)
    snd.send(Message(body='blue', properties={'colour': 'blue'}))
    snd.send(Message(body='red', properties={'colour': 'red'}))
    assert rcv.receive(timeout=10).body == 'red'
    conn.close()
    status, _ = broker.http_get('/console/')
    assert status == 200
    assert broker.http_get('/livez') == (200, b'ok\n')
    assert heavy_after_stop() == {'aiohttp', 'lark'}


def test_redis_py_alone_would_import_the_metrics_sdk_and_the_store_does_not() -> None:
    """When a redis-py upgrade stops importing the SDK, the guard in store/__init__.py can go."""
    probe = textwrap.dedent("""
        import sys
        import {module}
        loaded = 'opentelemetry.sdk.metrics' in sys.modules
        import opentelemetry.sdk.metrics  # importable afterwards: the mark is lifted
        print(loaded)
    """)
    for module, loaded in (('redis.asyncio', 'True'), ('shoal_broker.store.redisstore', 'False')):
        result = subprocess.run(
            [sys.executable, '-c', probe.format(module=module)],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        assert result.stdout.strip() == loaded, (module, result.stderr)
