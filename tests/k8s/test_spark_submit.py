"""
The chart's sparkSubmit analytics runner, run for real against the emulated API server: the
CronJob's own spark-submit command line (cluster mode) submits the driver pod, then the driver
runs as its pod would (the image's entrypoint with the pod's arguments and the spark.properties
the submitter made), asks for an executor, replaces one that fails, and stops. The test plays
the kubelet (pod phases). Every request the submitter and the driver make must be allowed by
the Role the chart gives each, each Role must grant nothing they did not use, and the driver and
executor pods must pass PodSecurity "restricted".
"""

import asyncio
import os
import sys
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import rbac
from chartrender import Manifest, one, render
from fabric8emulator import Fabric8Emulator
from podsecurity import restricted_violations

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
VALUES = {'analytics': {'enabled': True, 'runner': 'sparkSubmit'}}
NAMESPACE = 'shoal-system'
SUBMITTER, DRIVER = 'spark-submitter', 'spark-driver'
"""Bearer tokens the two log in with, so their requests are told apart."""
SPARK_HOME = (
    Path(sys.prefix)
    / 'lib'
    / f'python{sys.version_info[0]}.{sys.version_info[1]}'
    / ('site-packages/pyspark')
)
STAND_IN_APP = """
import os, time
from pyspark.sql import SparkSession
session = SparkSession.builder.getOrCreate()
deadline = time.monotonic() + 90
while not os.path.exists(os.environ['STOP_FLAG']) and time.monotonic() < deadline:
    time.sleep(0.2)
session.stop()
"""
"""The driver's application: up, held until the test has played an executor's loss, down (the
analytics job proper needs live executors, which nothing runs here)."""


@pytest.fixture
def kmock_options() -> dict[str, Any]:
    return {'cls': Fabric8Emulator}


@pytest.fixture
async def api(kmock: Any) -> Any:
    with warnings.catch_warnings():  # kmock 0.8 reads its bundle with a deprecated call
        warnings.simplefilter('ignore', DeprecationWarning)
        kmock.resources.load_bundled()
    return kmock


@pytest.fixture
def manifests() -> list[Manifest]:
    return render(VALUES)


def objects(api: Any, plural: str) -> dict[str, dict[str, Any]]:
    return {
        key[2]: obj.raw
        for key, obj in list(api._objects.items())
        if key[0].plural == plural and not obj.deleted
    }


async def eventually(probe: Callable[[], Any], what: str, limit: float = 120) -> Any:
    deadline = asyncio.get_running_loop().time() + limit
    while not (found := probe()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f'not within {limit} s: {what}')
        await asyncio.sleep(0.2)
    return found


async def set_phase(api: Any, pod: str, phase: str, ready: bool = False) -> None:
    status: dict[str, Any] = {'phase': phase}
    if ready:
        status['conditions'] = [{'type': 'Ready', 'status': 'True'}]
    if phase == 'Failed':
        status['containerStatuses'] = [{'name': 'executor', 'ready': False, 'state': {
            'terminated': {'exitCode': 1, 'reason': 'Error'}}}]  # fmt: skip
    url = f'{str(api.url).rstrip("/")}/api/v1/namespaces/{NAMESPACE}/pods/{pod}'
    async with (
        aiohttp.ClientSession() as session,
        session.patch(
            url, json={'status': status}, headers={'Content-Type': 'application/merge-patch+json'}
        ) as response,
    ):
        assert response.status == 200, await response.text()


def role_rules(manifests: list[Manifest], name: str) -> list[Manifest]:
    return [one(manifests, 'Role', name)]


def accesses(api: Any, token: str) -> set[rbac.Access]:
    """What the requests bearing ``token`` needed, with what the API server also checks: a
    server-side apply that creates is authorized as a create too."""
    found: set[rbac.Access] = set()
    for request in list(api):
        if request.headers.get('Authorization') != f'Bearer {token}':
            continue
        method, path = str(request.method.value).upper(), request.url.path
        needed = rbac.access(method, path, dict(request.params))
        if needed is None:
            continue
        found.add(needed)
        found.update(rbac.implied(method, path, request.data))
        if id(request) in api.applied_creates:
            found.add(rbac.Access('create', needed.group, needed.resource, needed.namespace))
    return found


def submit_command(manifests: list[Manifest], api_url: str, templates: Path) -> list[str]:
    """The CronJob's spark-submit command line, pointed at the emulator and the templates on
    disk (the pod mounts them from the chart's ConfigMap)."""
    cronjob = one(manifests, 'CronJob')
    (container,) = cronjob['spec']['jobTemplate']['spec']['template']['spec']['containers']
    args: list[str] = list(container['args'])
    assert args[:5] == ['spark-submit', '--master', 'k8s://https://kubernetes.default.svc:443',
                        '--deploy-mode', 'cluster']  # fmt: skip
    args[0] = str(SPARK_HOME / 'bin' / 'spark-submit')
    args[2] = f'k8s://{api_url}'
    args = [a.replace('/opt/shoal/pod-templates', str(templates)) for a in args]
    token = f'spark.kubernetes.authenticate.submission.oauthToken={SUBMITTER}'
    return [*args[:-1], '--conf', token, args[-1]]


def driver_command(pod: dict[str, Any], properties: Path, app: Path, api_url: str,
                   token: Path) -> list[str]:  # fmt: skip
    """The driver pod's command (the image's entrypoint with the pod's arguments), with the
    files the pod would have mounted taken from disk."""
    (container,) = pod['spec']['containers']
    args = list(container['args'])
    assert args[:3] == ['driver', '--properties-file', '/opt/spark/conf/spark.properties']
    assert args[-1] == 'local:///opt/shoal/analytics-job.py'
    return [
        'bash', str(ROOT / 'docker' / 'spark-entrypoint.sh'), 'driver',
        '--properties-file', str(properties),
        '--conf', f'spark.kubernetes.driver.master={api_url}',
        '--conf', f'spark.kubernetes.authenticate.driver.mounted.oauthTokenFile={token}',
        '--conf', 'spark.driver.host=127.0.0.1',
        '--conf', 'spark.ui.enabled=false',
        '--conf', 'spark.scheduler.maxRegisteredResourcesWaitingTime=1s',
        *args[3:-1], str(app),
    ]  # fmt: skip


def mounted_config_maps(api: Any, pod: dict[str, Any], root: Path) -> list[str] | None:
    """Writes the ConfigMaps the pod mounts under ``root`` as the kubelet would mount them, and
    returns their mount paths; None while one of them is missing."""
    volumes = {v['name']: v['configMap'] for v in pod['spec']['volumes'] if 'configMap' in v}
    config_maps = objects(api, 'configmaps')
    (container,) = pod['spec']['containers']
    mounts = [m for m in container['volumeMounts'] if m['name'] in volumes]
    if any(volumes[m['name']]['name'] not in config_maps for m in mounts):
        return None
    for mount in mounts:
        folder = root / mount['mountPath'].lstrip('/')
        folder.mkdir(parents=True, exist_ok=True)
        volume = volumes[mount['name']]
        data = config_maps[volume['name']].get('data', {})
        paths = {item['key']: item['path'] for item in volume.get('items') or []}
        for key, value in data.items():
            (folder / paths.get(key, key)).write_text(value)
    return [m['mountPath'] for m in mounts]


@pytest.fixture
async def processes() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    started: list[asyncio.subprocess.Process] = []
    yield started
    for process in started:
        if process.returncode is None:
            process.kill()
        await process.wait()


@pytest.mark.timeout(300)
async def test_spark_submit_and_its_driver_stay_within_their_roles_and_pass_restricted(
    api: Any, manifests: list[Manifest], tmp_path: Path,
    processes: list[asyncio.subprocess.Process],
) -> None:  # fmt: skip
    api_url = str(api.url).rstrip('/')
    templates = tmp_path / 'pod-templates'
    templates.mkdir()
    configmap = one(manifests, 'ConfigMap', 'rel-shoal-spark-pod-templates')
    for name, text in configmap['data'].items():
        (templates / name).write_text(text)
    env = {**os.environ, 'SPARK_LOCAL_IP': '127.0.0.1', 'SPARK_HOME': str(SPARK_HOME),
           'KUBECONFIG': str(tmp_path / 'none'), 'PYSPARK_PYTHON': sys.executable,
           'PYSPARK_DRIVER_PYTHON': sys.executable,
           'STOP_FLAG': str(tmp_path / 'stop')}  # fmt: skip
    with (tmp_path / 'submit.log').open('w') as log:
        submitter = await asyncio.create_subprocess_exec(
            *submit_command(manifests, api_url, templates), env=env, stdout=log, stderr=log
        )
    processes.append(submitter)

    def driver_pods() -> list[dict[str, Any]]:
        return [p for n, p in objects(api, 'pods').items() if n.endswith('-driver')]

    (driver_pod,) = await eventually(driver_pods, 'the submitter creates the driver pod')
    name = driver_pod['metadata']['name']
    assert driver_pod['spec']['serviceAccountName'] == 'rel-shoal-analytics'
    assert restricted_violations(driver_pod['spec']) == []
    (container,) = driver_pod['spec']['containers']
    assert {'name': 'lake', 'mountPath': '/data/lake'} in container['volumeMounts']
    assert {e['name'] for e in container['env']} >= {'SHOAL_REDIS_URL', 'SHOAL_ANALYTICS_LAKE'}
    mounts = await eventually(lambda: mounted_config_maps(api, driver_pod, tmp_path / 'pod'),
                              "the submitter applies the driver's ConfigMaps")  # fmt: skip
    properties = tmp_path / 'pod' / 'opt/spark/conf/spark.properties'
    text = properties.read_text()
    for mount_path in mounts:  # what the driver reads from its mounts, read from disk here
        text = text.replace(mount_path, str(tmp_path / 'pod') + mount_path)
    properties.write_text(text)
    await set_phase(api, name, 'Running', ready=True)  # the kubelet started it

    app = tmp_path / 'app.py'
    app.write_text(STAND_IN_APP)
    token = tmp_path / 'token'
    token.write_text(DRIVER)
    pod_env = {e['name']: e['value'] for e in container['env'] if 'value' in e}
    driver_env = {**env, **pod_env, 'SPARK_DRIVER_BIND_ADDRESS': '127.0.0.1',  # the pod's IP
                  'SPARK_LOCAL_DIRS': str(tmp_path)}  # fmt: skip
    with (tmp_path / 'driver.log').open('w') as log:
        driver = await asyncio.create_subprocess_exec(
            *driver_command(driver_pod, properties, app, api_url, token),
            env=driver_env, stdout=log, stderr=log,
        )  # fmt: skip
    processes.append(driver)

    def executor_pods() -> list[str]:
        return [n for n, p in objects(api, 'pods').items()
                if p['metadata'].get('labels', {}).get('spark-role') == 'executor']  # fmt: skip

    def running_executor_pods() -> list[str]:
        if driver.returncode is not None:
            raise AssertionError((tmp_path / 'driver.log').read_text()[-5000:])
        return executor_pods()

    (first,) = await eventually(running_executor_pods, 'the driver asks for its executor')
    executor_pod = objects(api, 'pods')[first]
    assert restricted_violations(executor_pod['spec']) == []
    await set_phase(api, first, 'Failed')  # lost: the driver deletes it and asks for another
    await eventually(lambda: running_executor_pods() and first not in executor_pods(),
                     'the driver replaces its lost executor')  # fmt: skip
    (tmp_path / 'stop').touch()
    assert await asyncio.wait_for(driver.wait(), 120) == 0, (tmp_path / 'driver.log').read_text()
    await set_phase(api, name, 'Succeeded')  # the driver's container ended
    assert await asyncio.wait_for(submitter.wait(), 120) == 0, (tmp_path / 'submit.log').read_text()
    assert executor_pods() == []  # deleted on stop

    for token_name, role in (
        (SUBMITTER, 'rel-shoal-spark-submit'),
        (DRIVER, 'rel-shoal-spark-driver'),
    ):
        rules = role_rules(manifests, role)
        used = accesses(api, token_name)
        refused = sorted(str(a) for a in used if not rbac.allowed(rules, a))
        assert refused == [], f'{token_name} made requests {role} does not allow'
        unused = rbac.granted(rules) - {a.grant for a in used}
        assert unused == set(), f'{role} grants what {token_name} never used'
