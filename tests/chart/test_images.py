"""
The image recipes (docker/*.Dockerfile), checked statically since no Docker engine runs here:
pinned bases, every COPY source present and inside the build context, non-root users, the
contracted extras and entrypoints (console scripts of pyproject.toml), and the files the chart
runs in them. The two scripts the analytics image adds are run for real.
"""

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from chartrender import CHART_DIR, ROOT, container, one, render

from shoal_analytics.params import AnalysisParams
from shoal_broker.settings import BrokerSettings

DOCKER = ROOT / 'docker'
# contracts.md: image → (extras, console scripts it must provide)
IMAGES = {
    # tracing: spec.broker.tracing.enabled works with the image the operator already runs
    'broker': ({'broker', 'operator', 'tracing'}, {'shoal-broker', 'shoal-operator'}),
    'analytics': ({'broker', 'analytics'}, {'shoal-analytics'}),
}
CONTRACT_SCRIPTS = {'shoal-broker', 'shoal-operator', 'shoal-analytics'}


def instructions(image: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/IMAGE.Dockerfile, continuation lines joined."""
    text = (DOCKER / f'{image}.Dockerfile').read_text()
    text = re.sub(r'\\\n', ' ', text)
    parsed = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith('#'):
            keyword, _, rest = line.partition(' ')
            parsed.append((keyword.upper(), rest.strip()))
    return parsed


def args_defaults(image: str) -> dict[str, str]:
    return dict(
        rest.split('=', 1)
        for keyword, rest in instructions(image)
        if keyword == 'ARG' and '=' in rest
    )


@pytest.mark.parametrize('image', IMAGES)
def test_base_images_are_pinned_to_exact_versions(image: str) -> None:
    defaults = args_defaults(image)
    stages: set[str] = set()
    for keyword, rest in instructions(image):
        if keyword != 'FROM':
            continue
        words = rest.split()
        base = re.sub(r'\$\{(\w+)\}', lambda m: defaults[m.group(1)], words[0])
        if base not in stages:
            repository, _, tag = base.rpartition(':')
            assert repository, base
            assert re.search(r'\d+\.\d+\.\d+', tag), f'{base} is not pinned to a version'
        if len(words) == 3 and words[1].upper() == 'AS':
            stages.add(words[2])


@pytest.mark.parametrize('image', IMAGES)
def test_every_copy_source_exists_and_is_in_the_build_context(image: str) -> None:
    ignore = (DOCKER / f'{image}.Dockerfile.dockerignore').read_text().splitlines()
    allowed = {line[1:].rstrip('/') for line in ignore if line.startswith('!')}
    assert '*' in ignore  # everything else stays out of the context
    sources = []
    for keyword, rest in instructions(image):
        if keyword == 'COPY' and '--from=' not in rest:
            sources += rest.split()[:-1]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f'COPY {source}: no such file'
        assert source in allowed, f'COPY {source}: excluded by the .dockerignore'


@pytest.mark.parametrize('image', IMAGES)
def test_the_wheel_builds_from_what_is_copied(image: str) -> None:
    """hatch needs every package directory the wheel names, and the readme."""
    project = tomllib.loads((ROOT / 'pyproject.toml').read_text())
    copied = {
        source
        for keyword, rest in instructions(image)
        if keyword == 'COPY' and '--from=' not in rest
        for source in rest.split()[:-1]
    }
    packages = project['tool']['hatch']['build']['targets']['wheel']['packages']
    needed = {package.split('/')[0] for package in packages} | {project['project']['readme']}
    assert needed | {'pyproject.toml'} <= copied


@pytest.mark.parametrize('image', IMAGES)
def test_images_install_the_contracted_extras_and_run_non_root(image: str) -> None:
    extras, _ = IMAGES[image]
    runs = ' '.join(rest for keyword, rest in instructions(image) if keyword == 'RUN')
    (installed,) = re.findall(r"pip install [^&]*'\.\[([a-z,]+)\]'", runs)
    assert set(installed.split(',')) == extras
    (user,) = [rest for keyword, rest in instructions(image) if keyword == 'USER']
    uid = user.split(':')[0]
    assert uid.isdigit()
    assert int(uid) != 0


def commands(image: str) -> set[str]:
    """Console scripts the image's CMD names, plus those the chart runs in the image."""
    named = set()
    for keyword, rest in instructions(image):
        if keyword == 'CMD':
            named.add(re.findall(r'"([^"]+)"', rest)[0])
    manifests = render({'analytics': {'enabled': True}})
    operator = container(one(manifests, 'Deployment')['spec']['template']['spec'], 'operator')
    return named | ({operator['command'][0]} if image == 'broker' else set())


@pytest.mark.parametrize('image', IMAGES)
def test_entrypoints_are_the_contracted_console_scripts(image: str) -> None:
    _, provided = IMAGES[image]
    assert commands(image) - {'python'} <= provided
    scripts = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['scripts']
    assert 'shoal-broker' in scripts
    # shoal-operator and shoal-analytics arrive with the operator and analytics packages; each
    # contracted script pyproject declares must point at a function of a module that exists.
    for name in CONTRACT_SCRIPTS & scripts.keys():
        module, _, function = scripts[name].partition(':')
        package, *rest = module.split('.')
        roots = [p for p in ('broker', 'operator', 'analytics') if (ROOT / p / package).is_dir()]
        assert roots, f'{name}: no package {package}'
        path = ROOT / roots[0] / package / Path(*rest).with_suffix('.py')
        assert re.search(rf'^def {function}\(', path.read_text(), re.MULTILINE), scripts[name]


def test_chart_runs_the_job_script_where_the_image_puts_it() -> None:
    copies = [rest.split() for keyword, rest in instructions('analytics') if keyword == 'COPY']
    destinations = {source: target for *sources, target in copies for source in sources}
    target = destinations['docker/analytics-job.py']
    cronjob = render({'analytics': {'enabled': True}})
    job = one(cronjob, 'CronJob')['spec']['jobTemplate']['spec']['template']['spec']
    assert container(job, 'analytics')['args'] == ['python', target]
    app = one(
        render({'analytics': {'enabled': True, 'runner': 'sparkOperator'}}),
        'ScheduledSparkApplication',
    )
    assert app['spec']['template']['mainApplicationFile'] == f'local://{target}'
    entrypoint = destinations['docker/spark-entrypoint.sh']
    (declared,) = [rest for keyword, rest in instructions('analytics') if keyword == 'ENTRYPOINT']
    assert entrypoint in declared
    assert os.access(DOCKER / 'spark-entrypoint.sh', os.X_OK)


def load_job_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location('analytics_job', DOCKER / 'analytics-job.py')
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_job_script_runs_ingest_then_analyze_with_the_contracted_options() -> None:
    job = load_job_module()
    environment = {
        'SHOAL_REDIS_URL': 'redis://r:6379/0',
        'SHOAL_ANALYTICS_LAKE': '/data/lake',
        'SHOAL_ANALYTICS_MAX_RECORDS_PER_BATCH': '5000',
        'SHOAL_ANALYTICS_CAPACITY_PER_REPLICA': '1500',
    }
    assert job.steps(environment) == [
        ['ingest', '--redis-url', 'redis://r:6379/0', '--lake', '/data/lake',
         '--max-records-per-batch', '5000'],
        ['analyze', '--lake', '/data/lake', '--redis-url', 'redis://r:6379/0',
         '--capacity-per-replica', '1500'],
    ]  # fmt: skip
    with pytest.raises(job.JobError, match='SHOAL_ANALYTICS_LAKE'):
        job.steps({'SHOAL_REDIS_URL': 'redis://r:6379/0'})


def test_the_jobs_windows_hold_a_quiet_entitys_record_at_the_brokers_default_heartbeat() -> None:
    """A broker writes the record of a quiet entity only every heartbeat, and an analysis needs
    one in every window: the heartbeat must be at most half the window. The chart's job passes
    no window, so it analyses the default one; the brokers' default heartbeat fits it, and the
    CRD the chart installs names that window to whoever sets ``metricsHeartbeatSeconds``."""
    job = load_job_module()
    environment = {'SHOAL_REDIS_URL': 'redis://r:6379/0', 'SHOAL_ANALYTICS_LAKE': '/lake'}
    for step in job.steps(environment):
        assert '--window-seconds' not in step
    window = AnalysisParams().window_seconds
    assert BrokerSettings().store.metrics_heartbeat_seconds <= window / 2
    crd = yaml.safe_load((CHART_DIR / 'crds/shoal.dev_brokerclusters.yaml').read_text())
    [version] = crd['spec']['versions']
    spec = version['schema']['openAPIV3Schema']['properties']['spec']
    heartbeat = spec['properties']['broker']['properties']['metricsHeartbeatSeconds']
    assert f"{window} s for the chart's job: at most {window // 2}" in heartbeat['description']


def test_job_script_analyzes_only_once_records_landed(tmp_path: Path) -> None:
    job = load_job_module()
    assert not job.has_raw_records(str(tmp_path))
    (tmp_path / 'raw' / '_spark_metadata').mkdir(parents=True)
    assert not job.has_raw_records(str(tmp_path))
    (tmp_path / 'raw' / 'day=2026-11-21').mkdir()
    (tmp_path / 'raw' / 'day=2026-11-21' / 'part-0.snappy.parquet').write_bytes(b'PAR1')
    assert job.has_raw_records(str(tmp_path))


def test_job_script_run_without_settings_fails_clearly() -> None:
    result = subprocess.run(
        [sys.executable, str(DOCKER / 'analytics-job.py')],
        env={'PATH': os.environ['PATH'], 'SHOAL_ANALYTICS_LAKE': '/lake'},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == 'analytics job failed: missing environment: SHOAL_REDIS_URL\n'


def fake_tool(path: Path) -> None:
    """An executable that prints its arguments, one per line (stands in for java/spark-submit)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    path.chmod(0o755)


def run_entrypoint(tmp_path: Path, *args: str, **environment: str) -> list[str]:
    fake_tool(tmp_path / 'spark' / 'bin' / 'spark-submit')
    fake_tool(tmp_path / 'java' / 'bin' / 'java')
    result = subprocess.run(
        [str(DOCKER / 'spark-entrypoint.sh'), *args],
        env={'PATH': os.environ['PATH'], 'SPARK_HOME': str(tmp_path / 'spark'),
             'JAVA_HOME': str(tmp_path / 'java'), **environment},
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return result.stdout.splitlines()


def test_entrypoint_starts_the_driver_in_client_mode(tmp_path: Path) -> None:
    argv = run_entrypoint(
        tmp_path, 'driver', '--properties-file', '/opt/spark/conf/spark.properties',
        'local:///opt/shoal/analytics-job.py', SPARK_DRIVER_BIND_ADDRESS='10.0.0.7',
    )  # fmt: skip
    assert argv == [
        '--conf', 'spark.driver.bindAddress=10.0.0.7',
        '--conf', 'spark.executorEnv.SPARK_DRIVER_POD_IP=10.0.0.7',
        '--deploy-mode', 'client',
        '--properties-file', '/opt/spark/conf/spark.properties',
        'local:///opt/shoal/analytics-job.py',
    ]  # fmt: skip


def test_entrypoint_starts_an_executor_from_sparks_environment(tmp_path: Path) -> None:
    argv = run_entrypoint(
        tmp_path, 'executor',
        SPARK_JAVA_OPT_10='-Dlast=1', SPARK_JAVA_OPT_2='-Dsecond=1', SPARK_JAVA_OPT_0='-Dfirst=1',
        SPARK_EXECUTOR_MEMORY='1g', SPARK_DRIVER_URL='spark://CoarseGrainedScheduler@d:7078',
        SPARK_EXECUTOR_ID='3', SPARK_EXECUTOR_CORES='1', SPARK_APPLICATION_ID='spark-app-1',
        SPARK_EXECUTOR_POD_IP='10.0.0.9', SPARK_RESOURCE_PROFILE_ID='0',
        SPARK_EXECUTOR_POD_NAME='app-exec-3',
    )  # fmt: skip
    assert argv[:3] == ['-Dfirst=1', '-Dsecond=1', '-Dlast=1']  # numeric order, not text order
    assert argv[3:7] == ['-Xms1g', '-Xmx1g', '-cp', f'{tmp_path}/spark/jars/*']
    assert argv[7] == 'org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend'
    options = dict(zip(argv[8::2], argv[9::2], strict=True))
    assert options == {
        '--driver-url': 'spark://CoarseGrainedScheduler@d:7078',
        '--executor-id': '3',
        '--cores': '1',
        '--app-id': 'spark-app-1',
        '--hostname': '10.0.0.9',
        '--resourceProfileId': '0',
        '--podName': 'app-exec-3',
    }


def test_entrypoint_runs_any_other_command_as_given(tmp_path: Path) -> None:
    assert run_entrypoint(tmp_path, 'echo', 'shoal-analytics', '--help') == [
        'shoal-analytics --help'
    ]
