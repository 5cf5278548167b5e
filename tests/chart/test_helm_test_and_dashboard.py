"""
The parts of the chart that talk to a broker, run against a real one: the `helm test` script
(taken from the rendered ConfigMap) sends and receives through a real broker process, and every
metric the Grafana dashboard queries is one a real broker exports.
"""

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from chartrender import CHART_DIR, NAMESPACE, container, env, find, one, render
from exposition import exported_series
from helm_python import HelmRenderError
from processes import BrokerProcess, free_port
from proton import Message
from proton.utils import BlockingConnection


def hook_script(tmp_path: Path) -> Path:
    manifests = render()
    (config,) = [m for m in find(manifests, 'ConfigMap') if 'send_receive.py' in m['data']]
    script = tmp_path / 'send_receive.py'
    script.write_text(config['data']['send_receive.py'])
    return script


def run_hook(
    script: Path, url: str, queue: str, login: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The script as the test pod runs it; LOGIN holds SHOAL_TEST_USERNAME/PASSWORD, which the
    pod reads from tests.credentialsSecret."""
    return subprocess.run(
        [sys.executable, str(script)],
        env={'SHOAL_TEST_URL': url, 'SHOAL_TEST_QUEUE': queue, **(login or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_test_hook_pod_targets_the_example_cluster_from_the_broker_image() -> None:
    manifests = render()
    pod = one(manifests, 'Pod')
    assert pod['metadata']['annotations']['helm.sh/hook'] == 'test'
    config = next(m for m in find(manifests, 'ConfigMap') if 'send_receive.py' in m['data'])
    assert config['metadata']['annotations']['helm.sh/hook'] == 'test'
    test = container(pod['spec'], 'send-receive')
    assert test['image'] == 'ghcr.io/shoal-dev/shoal:0.1.0'
    assert test['command'] == ['python', '/scripts/send_receive.py']
    assert env(test)['SHOAL_TEST_URL'] == f'amqp://shoal.{NAMESPACE}.svc:5672'
    # The example cluster refuses ANONYMOUS by default: the test logs in from a Secret.
    assert [
        (e['name'], e['valueFrom']['secretKeyRef']) for e in test['env'] if 'valueFrom' in e
    ] == [
        ('SHOAL_TEST_USERNAME', {'name': 'shoal-test-credentials', 'key': 'username'}),
        ('SHOAL_TEST_PASSWORD', {'name': 'shoal-test-credentials', 'key': 'password'}),
    ]
    assert {'name': 'scripts', 'configMap': {'name': config['metadata']['name']}} in (
        pod['spec']['volumes']
    )
    # No example cluster and no URL: nothing to test against, so no test pod.
    assert find(render({'exampleCluster': {'enabled': False}}), 'Pod') == []
    other = render({'exampleCluster': {'enabled': False}, 'tests': {'brokerUrl': 'amqp://b:5672'}})
    assert env(container(one(other, 'Pod')['spec'], 'send-receive'))['SHOAL_TEST_URL'] == (
        'amqp://b:5672'
    )


def login_env(manifests: list[dict[str, Any]]) -> set[str]:
    pod = one(manifests, 'Pod')
    return {e['name'] for e in container(pod['spec'], 'send-receive')['env']} & {
        'SHOAL_TEST_USERNAME', 'SHOAL_TEST_PASSWORD'}  # fmt: skip


def test_the_hook_logs_in_unless_the_example_cluster_allows_anonymous() -> None:
    both = {'SHOAL_TEST_USERNAME', 'SHOAL_TEST_PASSWORD'}
    assert login_env(render({'exampleCluster': {'auth': {'allowAnonymous': True}}})) == set()
    external = {'exampleCluster': {'enabled': False}, 'tests': {'brokerUrl': 'amqp://b:5672'}}
    assert login_env(render(external)) == both  # the default credentials Secret
    external['tests']['credentialsSecret'] = ''
    assert login_env(render(external)) == set()
    # another broker is tested as configured, whatever the example cluster allows
    external.update(exampleCluster={'enabled': True, 'auth': {'allowAnonymous': True}})
    external['tests']['credentialsSecret'] = 'creds'
    assert login_env(render(external)) == both
    with pytest.raises(HelmRenderError, match=r'tests\.credentialsSecret is required'):
        render({'tests': {'credentialsSecret': ''}})
    assert find(render({'tests': {'enabled': False, 'credentialsSecret': ''}}), 'Pod') == []


def shoal_user_add(users_file: Path, name: str, password: str) -> None:
    """The command the README and NOTES.txt give for the users Secret's file."""
    subprocess.run(
        [sys.executable, '-m', 'shoal_broker.admin', 'user', 'add', name, '--users-file',
         str(users_file), '--password-stdin', '--send', '*', '--consume', '*'],
        input=password, text=True, check=True, capture_output=True, timeout=60,
    )  # fmt: skip


def test_hook_script_logs_in_with_plain_to_a_broker_without_anonymous(
    tmp_path: Path, start_broker: Callable[..., BrokerProcess], address: str
) -> None:
    users = tmp_path / 'users.json'
    shoal_user_add(users, 'app', 'app-secret')
    secured = start_broker(env={'SHOAL_USERS_FILE': str(users), 'SHOAL_ALLOW_ANONYMOUS': 'false'})
    script = hook_script(tmp_path)
    login = {'SHOAL_TEST_USERNAME': 'app', 'SHOAL_TEST_PASSWORD': 'app-secret'}
    result = run_hook(script, secured.url, address, login)
    assert result.returncode == 0, result.stderr
    assert f'on {address} via {secured.url}' in result.stdout
    # the same broker turns away an anonymous test and a wrong password
    assert run_hook(script, secured.url, address).returncode != 0
    wrong = {**login, 'SHOAL_TEST_PASSWORD': 'guess'}
    assert run_hook(script, secured.url, address, wrong).returncode != 0


def test_hook_script_sends_and_receives_through_a_real_broker(
    tmp_path: Path, broker: BrokerProcess, address: str
) -> None:
    script = hook_script(tmp_path)
    # A leftover of an earlier run is skipped, not mistaken for this run's message.
    conn = BlockingConnection(broker.url)
    conn.create_sender(address).send(Message(id='leftover', body='old'))
    conn.close()
    result = run_hook(script, broker.url, address)
    assert result.returncode == 0, result.stderr
    assert f'on {address} via {broker.url}' in result.stdout
    result = run_hook(script, broker.url, address)  # again: the queue is reusable
    assert result.returncode == 0, result.stderr


def test_hook_script_fails_when_no_broker_answers(tmp_path: Path) -> None:
    result = run_hook(hook_script(tmp_path), f'amqp://127.0.0.1:{free_port()}', 'q')
    assert result.returncode != 0


def dashboard_metrics() -> set[str]:
    dashboard = json.loads((CHART_DIR / 'files' / 'dashboards' / 'shoal.json').read_text())
    expressions = [t['expr'] for p in dashboard['panels'] for t in p['targets']]
    expressions += [v['query'] for v in dashboard['templating']['list'] if v['type'] == 'query']
    return {name for e in expressions for name in re.findall(r'\bshoal_[a-z_]+', e)}


def test_dashboard_queries_only_metrics_the_broker_exports(broker: BrokerProcess) -> None:
    wanted = dashboard_metrics()
    assert len(wanted) >= 12
    assert wanted - exported_series(broker) == set()


def test_dashboard_ships_in_a_config_map_grafana_imports() -> None:
    manifests = render({'grafanaDashboard': {'enabled': True}})
    (config,) = [m for m in find(manifests, 'ConfigMap') if 'shoal.json' in m['data']]
    assert config['metadata']['labels']['grafana_dashboard'] == '1'
    dashboard = json.loads(config['data']['shoal.json'])
    assert dashboard['uid'] == 'shoal-broker'
    ids = [p['id'] for p in dashboard['panels']]
    assert len(ids) == len(set(ids))
    assert not [m for m in render() if 'shoal.json' in m.get('data', {})]


@pytest.mark.parametrize('kind', ['counter', 'histogram'])
def test_exported_series_reads_types(broker: BrokerProcess, kind: str) -> None:
    """The check above can fail: the exposition lists names by type, nothing is invented."""
    series = exported_series(broker)
    expected = {
        'counter': 'shoal_messages_enqueued_total',
        'histogram': 'shoal_delivery_latency_seconds_bucket',
    }
    assert expected[kind] in series
    assert 'shoal_no_such_metric_total' not in series
