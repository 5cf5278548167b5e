"""
hatchling build hook: compiles the broker's C (scripts/build_wire.py) into every wheel,
the editable one of ``make`` included, which then finds it in the source tree.
"""

import importlib.util
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class WireBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = 'custom'

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        spec = importlib.util.spec_from_file_location(
            'build_wire', Path(self.root) / 'scripts' / 'build_wire.py'
        )
        assert spec is not None
        assert spec.loader is not None
        builder = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(builder)
        broker = Path(self.root) / 'broker'
        built = builder.build(broker)
        build_data['pure_python'] = False
        build_data['infer_tag'] = True
        if version != 'editable':
            for path in built:
                build_data['force_include'][str(path)] = str(path.relative_to(broker))
