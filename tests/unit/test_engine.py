"""
The broker calls python-qpid-proton's internal cffi module; this is the loud failure when the
installed binding no longer has what the broker calls.
"""

import re
from pathlib import Path

import cproton
import proton
from cproton_ffi import lib

from shoal_broker.amqp import engine

AMQP_DIR = Path(engine.__file__).parent
LIB_NAME = re.compile(r'\blib\.(pn_\w+|PN_\w+)')
CPROTON_NAME = re.compile(r'\bcproton\.(pn_\w+)')


def names_used(pattern: re.Pattern[str]) -> dict[str, list[str]]:
    """Every name ``pattern`` finds under amqp/, with the files using it."""
    used: dict[str, list[str]] = {}
    for path in sorted(AMQP_DIR.rglob('*.py')):
        for name in pattern.findall(path.read_text(encoding='utf-8')):
            used.setdefault(name, []).append(path.name)
    return used


def test_engine_imports_on_the_installed_binding() -> None:
    assert engine.lib is lib
    assert proton.VERSION[:2] == engine.SUPPORTED_PROTON


def test_every_lib_function_and_constant_the_broker_uses_exists() -> None:
    used = names_used(LIB_NAME)
    assert len(used) > 50, 'the scan found too few lib.* names: is the regex still right?'
    assert any(name.startswith('PN_') for name in used)
    missing = {name: files for name, files in sorted(used.items()) if not hasattr(lib, name)}
    assert missing == {}


def test_every_cproton_wrapper_the_broker_uses_exists() -> None:
    used = names_used(CPROTON_NAME)
    assert used, 'the scan found no cproton.* names: is the regex still right?'
    missing = {name: files for name, files in sorted(used.items()) if not hasattr(cproton, name)}
    assert missing == {}


def test_the_scan_would_notice_a_missing_name() -> None:
    assert not hasattr(lib, 'pn_no_such_function')
    assert LIB_NAME.findall('lib.pn_link_recv(x); lib.PN_EOS; ffi.new') == [
        'pn_link_recv',
        'PN_EOS',
    ]
