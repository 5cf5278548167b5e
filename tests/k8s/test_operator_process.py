"""``python -m shoal_operator`` as a process: logs in with a kubeconfig, reconciles, answers its
liveness and metrics endpoints, and stops cleanly on SIGTERM."""

import asyncio
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import aiohttp
from kubeemulator import Kube, cluster_body
from processes import free_port


def kubeconfig(path: pathlib.Path, server: str) -> pathlib.Path:
    path.write_text(f'''apiVersion: v1
kind: Config
clusters: [{{name: emulator, cluster: {{server: "{server}"}}}}]
users: [{{name: tester, user: {{token: not-checked}}}}]
contexts: [{{name: test, context: {{cluster: emulator, user: tester, namespace: default}}}}]
current-context: test
''')
    return path


async def get(url: str) -> tuple[int, str]:
    try:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return response.status, await response.text()
    except aiohttp.ClientError:
        return 0, ''


async def test_the_operator_process_reconciles_and_serves_health_and_metrics(
    kube: Kube, store_url: str, tmp_path: pathlib.Path
) -> None:
    health, metrics = f'127.0.0.1:{free_port()}', f'127.0.0.1:{free_port()}'
    env = {
        **os.environ,
        'KUBECONFIG': str(kubeconfig(tmp_path / 'config', str(kube.emulator.url))),
        'SHOAL_OPERATOR_HEALTH': health,
        'SHOAL_OPERATOR_METRICS': metrics,
        'SHOAL_BROKER_IMAGE': 'img:process',
        'SHOAL_OPERATOR_OBSERVE_SECONDS': '0.5',
    }
    log = (tmp_path / 'operator.log').open('wb')
    process = await asyncio.create_subprocess_exec(
        sys.executable, '-m', 'shoal_operator', env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        await kube.redis_secret(store_url)
        await kube.create('brokerclusters', cluster_body())

        async def deployment() -> Any:
            return await kube.get('deployments', 'shoal', api_version='apps/v1')

        created = await kube.eventually(deployment, 'the Deployment from the process')
        assert created['spec']['template']['spec']['containers'][0]['image'] == 'img:process'

        async def healthy() -> bool:
            return (await get(f'http://{health}/healthz'))[0] == 200

        await kube.eventually(healthy, 'a healthy liveness endpoint')

        async def counted() -> bool:
            _, text = await get(f'http://{metrics}/metrics')
            return 'shoal_operator_reconciles_total{kind="BrokerCluster",result="ok"}' in text

        await kube.eventually(counted, 'the reconcile counted on /metrics')
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 30)
        assert code == 0, (tmp_path / 'operator.log').read_text()[-3000:]
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        log.close()
