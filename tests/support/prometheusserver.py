"""A real Prometheus (Debian's ``prometheus``) on a free loopback port, scraping given targets every
``interval`` seconds and evaluating given rule files as often, its storage in a temporary
directory removed when it stops."""

import json
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from processes import LOOPBACK, free_port, stop, wait_for

Target = tuple[str, Mapping[str, str]]
"""A scrape target: ``host:port`` and the labels its series get (``pod``, ``namespace``, as a
ServiceMonitor gives them)."""


class PrometheusServer:
    def __init__(
        self, job: str, targets: Sequence[Target], rule_files: Sequence[Path], interval: float = 1
    ) -> None:
        binary = shutil.which('prometheus')
        assert binary, "prometheus is not installed (make test installs Debian's prometheus)"
        self.dir = Path(tempfile.mkdtemp(prefix='shoal-test-prometheus-'))
        config = {
            'global': {'scrape_interval': f'{interval}s', 'evaluation_interval': f'{interval}s'},
            'rule_files': [str(path) for path in rule_files],
            'scrape_configs': [{
                'job_name': job,
                'scrape_timeout': f'{interval}s',
                'static_configs': [
                    {'targets': [address], 'labels': dict(labels)} for address, labels in targets
                ],
            }],
        }  # fmt: skip
        (self.dir / 'prometheus.yml').write_text(yaml.safe_dump(config))
        self.port = free_port()
        self._log = (self.dir / 'prometheus.log').open('wb')
        self.process = subprocess.Popen(
            [binary, f'--config.file={self.dir / "prometheus.yml"}',
             f'--storage.tsdb.path={self.dir / "data"}',
             f'--web.listen-address={LOOPBACK}:{self.port}', '--log.level=warn'],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(self._ready, 30, 'prometheus')
        except TimeoutError:
            self.stop()
            raise

    def _ready(self) -> bool:
        assert self.process.poll() is None, self.log()
        try:
            with urllib.request.urlopen(f'http://{LOOPBACK}:{self.port}/-/ready', timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a /api/v1 answer; AssertionError on an error answer."""
        url = f'http://{LOOPBACK}:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}'
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                answer = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f'{path} {params}: {exc.code} {exc.read()!r}') from None
        assert answer['status'] == 'success', answer
        return answer['data']

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of ``expr`` now: [{'metric': labels, 'value': [ts, text]}, ...]."""
        data = self.api('query', query=expr)
        assert data['resultType'] == 'vector', data
        result: list[dict[str, Any]] = data['result']
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending or firing): [{'labels': ..., 'state': ...}, ...]."""
        alerts: list[dict[str, Any]] = self.api('alerts')['alerts']
        return alerts

    def log(self) -> str:
        return (self.dir / 'prometheus.log').read_text(errors='replace')

    def stop(self) -> None:
        stop(self.process)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
