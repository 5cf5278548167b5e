"""A client of the management API over plain HTTP (urllib): status and JSON of each call."""

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from processes import LOOPBACK, BrokerProcess


class Api:
    def __init__(self, broker: BrokerProcess, user: str | None = None, password: str = '') -> None:
        self.base = f'http://{LOOPBACK}:{broker.http_port}/api'
        self.auth = (
            'Basic ' + base64.b64encode(f'{user}:{password}'.encode()).decode() if user else None
        )

    def call(
        self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
        timeout: float = 60, **query: Any,
    ) -> tuple[int, Any]:  # fmt: skip
        url = self.base + path
        if query:
            url += '?' + urllib.parse.urlencode(query)
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header('Content-Type', 'application/json')
        if self.auth:
            request.add_header('Authorization', self.auth)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b'null')

    def get(self, path: str, **query: Any) -> Any:
        status, found = self.call('GET', path, **query)
        assert status == 200, (path, status, found)
        return found

    def post(self, path: str, body: Any = None) -> Any:
        status, found = self.call('POST', path, body)
        assert status == 200, (path, status, found)
        return found


def quoted(name: str) -> str:
    return urllib.parse.quote(name, safe='')
