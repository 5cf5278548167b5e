"""
The chart's PrometheusRule: rendered when the ServiceMonitors are (or as prometheusRule.enabled
says), carrying exactly charts/shoal/files/prometheus-rules.yaml, checked and unit-tested by
promtool (tests/chart/rules/: each alert fires on its synthetic series and stays quiet on a healthy
one), querying only series a real broker exports, each alert with a runbook line in docs/alerts.md.
"""

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartrender import CHART_DIR, ROOT, find, one, render, render_raw
from exposition import exported_series
from processes import BrokerProcess

RULES = CHART_DIR / 'files' / 'prometheus-rules.yaml'
UNIT_TESTS = Path(__file__).parent / 'rules' / 'prometheus-rules.test.yaml'
KUBE_STATE_METRICS = {'kube_deployment_spec_replicas', 'kube_deployment_status_replicas_available'}
"""Series the rules take from kube-state-metrics (the replicas a BrokerCluster asks for)."""


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which('promtool')
    assert binary, "promtool is not installed (make test installs Debian's prometheus package)"
    return subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def shipped_groups(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = one(render(values), 'PrometheusRule')['spec']['groups']
    return groups


def alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r['alert']: r for g in groups for r in g['rules'] if 'alert' in r}


def run_unit_tests(
    tmp_path: Path, groups: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    (tmp_path / 'rules.yaml').write_text(yaml.safe_dump({'groups': groups}, sort_keys=False))
    shutil.copy(UNIT_TESTS, tmp_path / 'rules.test.yaml')
    return promtool('test', 'rules', 'rules.test.yaml', cwd=tmp_path)


def test_the_rule_follows_the_service_monitor_unless_told_otherwise() -> None:
    assert find(render(), 'PrometheusRule') == []
    monitored = {'serviceMonitor': {'enabled': True, 'labels': {'release': 'prom'}}}
    rule = one(render(monitored), 'PrometheusRule')
    assert rule['metadata']['labels']['release'] == 'prom'  # what Prometheus selects on
    assert find(render({**monitored, 'prometheusRule': {'enabled': False}}), 'PrometheusRule') == []
    alone = one(render({'prometheusRule': {'enabled': True, 'labels': {'role': 'alerts'}}}),
                'PrometheusRule')  # fmt: skip
    assert alone['metadata']['labels']['role'] == 'alerts'
    notes = 'shoal/templates/NOTES.txt'
    assert 'Alerts: PrometheusRule rel-shoal-broker' in render_raw(monitored)[notes]
    assert 'Alerts:' not in render_raw()[notes]


def test_the_chart_ships_the_rule_file_promtool_tests() -> None:
    shipped = shipped_groups({'prometheusRule': {'enabled': True}})
    assert shipped == yaml.safe_load(RULES.read_text())['groups']
    assert set(alerts(shipped)) == {
        'ShoalBacklogGrowing', 'ShoalConsumerStarved', 'ShoalMessageWaitingLong',
        'ShoalDeadLetterQueueFilling',
        'ShoalRedisUnreachable', 'ShoalReplicaLeaseLost', 'ShoalReplicaDown',
        'ShoalReplicasMissing', 'ShoalProducersBlocked', 'ShoalPublishesRefused',
        'ShoalDuplicatesDropped',
        'ShoalSendsHeld', 'ShoalHeldSendsGivenUp',
    }  # fmt: skip


def test_promtool_checks_the_rules_and_every_alert_passes_its_unit_tests(tmp_path: Path) -> None:
    shipped = shipped_groups({'prometheusRule': {'enabled': True}})
    (tmp_path / 'rules.yaml').write_text(yaml.safe_dump({'groups': shipped}, sort_keys=False))
    checked = promtool('check', 'rules', 'rules.yaml', cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = run_unit_tests(tmp_path, shipped)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # every alert is evaluated by the unit tests (and fires there); quiet ones: BROKEN below
    cases = yaml.safe_load(UNIT_TESTS.read_text())['tests']
    evaluated = [c for t in cases for c in t.get('alert_rule_test', [])]
    for name in alerts(shipped):
        mine = [c for c in evaluated if c['alertname'] == name]
        assert any(c['exp_alerts'] for c in mine), f'{name} is never expected to fire'


def test_the_unit_tests_evaluate_the_recording_rules_before_the_alerts_that_read_them() -> None:
    """Without a pinned order promtool runs the groups in Go's map order, different per run."""
    groups = [g['name'] for g in yaml.safe_load(RULES.read_text())['groups']]
    order = yaml.safe_load(UNIT_TESTS.read_text()).get('group_eval_order')
    assert order == groups
    assert groups.index('shoal.rules') < groups.index('shoal.alerts')


BROKEN = {
    'ShoalBacklogGrowing': ('> 1000', '> 0'),  # a small backlog that grows by one a minute
    'ShoalConsumerStarved': ('shoal:consumers:sum > 0', 'shoal:consumers:sum >= 0'),  # nobody
    'ShoalMessageWaitingLong': ('shoal:consumers:sum > 0', 'shoal:consumers:sum >= 0'),  # DLQ
    'ShoalDeadLetterQueueFilling': ('> 0', '>= 0'),  # nothing dead-lettered
    'ShoalRedisUnreachable': ('== 0', '<= 1'),
    'ShoalReplicaLeaseLost': ('== 0', '<= 1'),
    'ShoalReplicaDown': ('up == 0', 'up >= 0'),
    'ShoalReplicasMissing': ('and on (namespace, deployment)', 'or on (namespace, deployment)'),
    'ShoalProducersBlocked': ('> 0', '>= 0'),  # nobody held back
    'ShoalPublishesRefused': ('> 0', '>= 0'),  # nothing refused any more
    'ShoalDuplicatesDropped': ('> 0', '>= 0'),  # none dropped
    'ShoalSendsHeld': ('> 10', '>= 0'),  # a few seconds' hold of a routine failover
    'ShoalHeldSendsGivenUp': ('> 0', '>= 0'),  # nothing given up
}
"""Per alert, an edit that makes it fire on a healthy series of its unit test."""


@pytest.mark.parametrize('alert', sorted(BROKEN))
def test_the_unit_tests_fail_on_a_rule_that_fires_on_healthy_series(
    tmp_path: Path, alert: str
) -> None:
    """The unit tests can fail: each alert, loosened to fire on its healthy series, is caught."""
    groups = shipped_groups({'prometheusRule': {'enabled': True}})
    rule = alerts(groups)[alert]
    old, new = BROKEN[alert]
    assert old in rule['expr']
    rule['expr'] = rule['expr'].replace(old, new)
    tested = run_unit_tests(tmp_path, groups)
    assert tested.returncode != 0
    assert f'alertname: {alert}' in tested.stdout + tested.stderr


def test_the_rules_query_only_series_a_broker_exports(broker: BrokerProcess) -> None:
    groups = yaml.safe_load(RULES.read_text())['groups']
    expressions = [r['expr'] for g in groups for r in g['rules']]
    queried = {n for e in expressions for n in re.findall(r'(?<![:\w])[a-z_]+(?=[\[{\s)]|$)', e)}
    queried = {n for n in queried if n.startswith(('shoal_', 'kube_'))}
    assert {'shoal_redis_up', 'shoal_backlog_messages', 'shoal_consumers'} <= queried
    assert queried - exported_series(broker) - KUBE_STATE_METRICS == set()


def test_every_alert_has_a_runbook_line() -> None:
    runbook = (ROOT / 'docs' / 'alerts.md').read_text()
    for name, rule in alerts(yaml.safe_load(RULES.read_text())['groups']).items():
        anchor = rule['annotations']['runbook_url'].rpartition('#')[2]
        assert anchor == name.lower()
        assert re.search(rf'^### {name}\n\n\S', runbook, re.MULTILINE), name
