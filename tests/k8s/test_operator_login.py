"""``python -m shoal_operator`` logs in with every kubeconfig form kubectl writes, against a real
HTTPS endpoint (the emulator behind a TLS front) whose CA is the test's own: the CA as a file
(relative to the kubeconfig, as kubectl resolves it) or inline base64 data, a client certificate
and key as files or inline data, a bearer token or a token file. Both of the operator's clients
(kopf's, which patches the status, and its own, which creates the children) must get through."""

import asyncio
import base64
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import pytest
import yaml
from certs import Authority, Pem
from kubeemulator import Kube, cluster_body
from processes import free_port
from tlsfront import tls_front

TOKEN = 'operator-token-0123456789'


@dataclasses.dataclass(frozen=True)
class Form:
    ca: str  # 'file' | 'data'
    user: str  # 'token' | 'token-file' | 'cert-files' | 'cert-data'


FORMS = [Form('data', 'token'), Form('file', 'token-file'), Form('data', 'cert-data'),
         Form('file', 'cert-files')]  # fmt: skip


def b64(path: pathlib.Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig(directory: pathlib.Path, server: str, form: Form, ca: Pem, client: Pem
               ) -> pathlib.Path:  # fmt: skip
    cluster: dict[str, Any] = {'server': server}
    if form.ca == 'data':
        cluster['certificate-authority-data'] = b64(ca.cert)
    else:  # a relative path is relative to the kubeconfig file, not to the working directory
        cluster['certificate-authority'] = os.path.relpath(ca.cert, directory)
    user: dict[str, Any]
    if form.user == 'token':
        user = {'token': TOKEN}
    elif form.user == 'token-file':
        (directory / 'token').write_text(TOKEN + '\n')
        user = {'tokenFile': str(directory / 'token')}
    elif form.user == 'cert-data':
        user = {'client-certificate-data': b64(client.cert), 'client-key-data': b64(client.key)}
    else:
        user = {'client-certificate': str(client.cert), 'client-key': str(client.key)}
    config = {
        'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'test',
        'clusters': [{'name': 'emulator', 'cluster': cluster}],
        'users': [{'name': 'operator', 'user': user}],
        'contexts': [{'name': 'test', 'context': {'cluster': 'emulator', 'user': 'operator'}}],
    }  # fmt: skip
    path = directory / 'config'
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize('form', FORMS, ids=lambda f: f'ca-{f.ca}-{f.user}')
async def test_the_operator_logs_in_with_each_kubeconfig_form(
    kube: Kube, store_url: str, tmp_path: pathlib.Path, form: Form
) -> None:
    pki = tmp_path / 'pki'
    pki.mkdir()
    authority = Authority(pki)
    server_pem = authority.issue('localhost', server=True)
    client_pem = authority.issue('shoal-operator', server=False)
    (tmp_path / 'kube').mkdir()
    with_certs = form.user.startswith('cert')
    url = kube.emulator.url
    client_ca = authority.pem.cert if with_certs else None
    async with tls_front(url.host, url.port, *dataclasses.astuple(server_pem), client_ca) as front:
        config = kubeconfig(tmp_path / 'kube', front, form, authority.pem, client_pem)
        env = {
            **os.environ,
            'KUBECONFIG': str(config),
            'SHOAL_OPERATOR_HEALTH': f'127.0.0.1:{free_port()}',
            'SHOAL_OPERATOR_METRICS': f'127.0.0.1:{free_port()}',
            'SHOAL_OPERATOR_NAMESPACES': 'default',
        }
        env.pop('KUBERNETES_SERVICE_HOST', None)
        log_path = tmp_path / 'operator.log'
        with log_path.open('wb') as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable, '-m', 'shoal_operator', env=env, stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                await kube.redis_secret(store_url)
                await kube.create('brokerclusters', cluster_body())

                async def reconciled() -> bool:  # the children (its client), the status (kopf's)
                    body = await kube.get('brokerclusters', 'shoal') or {}
                    observed = (body.get('status') or {}).get('observedGeneration')
                    deployment = await kube.get('deployments', 'shoal', api_version='apps/v1')
                    return observed == 1 and deployment is not None

                try:
                    await kube.eventually(reconciled, 'the cluster reconciled over HTTPS')
                except AssertionError as exc:
                    raise AssertionError(log_path.read_text()[-3000:]) from exc
                process.send_signal(signal.SIGTERM)
                code = await asyncio.wait_for(process.wait(), 30)
                assert code == 0, log_path.read_text()[-3000:]
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
    # the test's own requests carry no credentials; the operator's carry exactly its own
    requests = list(kube.emulator)
    bearers = {r.headers.get('Authorization') for r in requests} - {None}
    assert bearers == (set() if with_certs else {f'Bearer {TOKEN}'})
    if not with_certs:
        created = [
            r for r in requests if r.method == 'POST' and r.url.path.endswith('/deployments')
        ]
        status = [r for r in requests if r.method == 'PATCH' and 'brokerclusters' in r.url.path]
        assert {r.headers.get('Authorization') for r in created + status} == bearers
