"""The management API's OpenAPI document, run property-based (schemathesis, its command as a
user runs it) against a real broker: no generated request gets a 5xx."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from amqpclient import Capabilities, connect, sender
from processes import LOOPBACK
from proton import Message


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_no_generated_request_gets_a_server_error(
    start_broker: Any, address: str, tmp_path: Path
) -> None:
    b = start_broker()
    conn = connect(b.url)
    sender(conn, address, Capabilities('queue')).send(Message(body='x', properties={'n': 1}))
    conn.close()
    schemathesis = Path(sys.executable).with_name('schemathesis')
    run = subprocess.run(
        [
            str(schemathesis), 'run', f'http://{LOOPBACK}:{b.http_port}/api/openapi.json',
            '--checks', 'not_a_server_error', '--max-examples', '25', '--seed', '1',
            '--request-timeout', '30', '--report-dir', str(tmp_path),
        ],
        capture_output=True, text=True, timeout=540, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert 'Server error' not in run.stdout
    assert 'Tested: 19' in run.stdout, run.stdout[-3000:]  # every operation was exercised
