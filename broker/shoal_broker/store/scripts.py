"""
The Lua scripts' source, read from ``lua/`` (one file per operation, KEYS and ARGV in its header).

Redis scripts cannot call each other, so a script shares code by a line
``--! include NAME``, replaced here with ``lua/NAME.lua`` (publish.lua and publish_limited.lua
append entries the same way). The broker's store and the operator's registry both read them
through ``source``.
"""

import functools
from importlib import resources

INCLUDE = '--! include '


@functools.cache  # one string a script: the store finds its own by identity (script_heads.py)
def source(name: str) -> str:
    text = resources.files('shoal_broker.store').joinpath('lua', f'{name}.lua').read_text()
    return ''.join(
        source(line[len(INCLUDE) :].strip()) if line.startswith(INCLUDE) else line
        for line in text.splitlines(keepends=True)
    )
