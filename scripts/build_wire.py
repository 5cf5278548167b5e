"""
Compile the broker's C: ``broker/shoal_broker/amqp/_wire.c`` into the extension
``shoal_broker.amqp._wire``, ``broker/shoal_broker/routing/_entry.c`` (``Entry`` as a type the
garbage collector does not track) into ``shoal_broker.routing._entry``, and
``broker/shoal_broker/store/_replies.c`` (the store lane's replies read in C, which makes entries
through ``routing/_entry_api.h``) into ``shoal_broker.store._replies``, and
``broker/shoal_broker/metrics/_latency.c`` (accepted deliveries counted into the latency
histogram and sketch) into ``shoal_broker.metrics._latency``.

cffi in API mode: the C source is compiled with the declarations of ``_wire.h`` beside it, which
are all Python sees, and with ``_wire_outcomes.h``, written here from the outcome table in
``amqp/outcome_codes.py`` (the one source of the outcome codes C and Python share). Run by the
package build (scripts/hatch_build.py) and by benchmarks that put a source tree on PYTHONPATH
(``python scripts/build_wire.py BROKER_SOURCE_ROOT``). Needs a C compiler and the Python
headers, which python-qpid-proton's own build needs as well.
"""

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

import cffi
from setuptools import Distribution, Extension
from setuptools.command.build_ext import build_ext

MODULE = 'shoal_broker.amqp._wire'
EXTENSIONS = (('routing', '_entry'), ('store', '_replies'), ('metrics', '_latency'))
"""Plain CPython extensions, (package, module), in the order they are built: ``_replies`` and
``_latency`` include ``routing/_entry_api.h`` and import ``_entry`` when they load."""
OUTCOMES_HEADER = '_wire_outcomes.h'


def outcomes_header(package: Path) -> str | None:
    """The C text of ``package``'s outcome table, or None for a tree from before it had one."""
    table = package / 'outcome_codes.py'
    if not table.exists():
        return None
    spec = importlib.util.spec_from_file_location('shoal_outcome_codes', table)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text: str = module.c_header()
    return text


def build(source_root: Path) -> list[Path]:
    """Build the extensions next to their C sources under ``source_root``; return their paths."""
    built = [build_extension(source_root, package, name) for package, name in EXTENSIONS]
    return [build_wire(source_root), *(path for path in built if path is not None)]


def build_extension(source_root: Path, package_name: str, name: str) -> Path | None:
    """Build ``<package_name>/<name>.c`` (a plain CPython extension) next to its source; None
    for a tree from before it had one."""
    package = source_root / 'shoal_broker' / package_name
    source = package / f'{name}.c'
    if not source.exists():
        return None
    module = f'shoal_broker.{package_name}.{name}'
    extension = Extension(
        module, [str(source)], include_dirs=[str(source_root / 'shoal_broker' / 'routing')],
        extra_compile_args=['-O2', '-Wall'],
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix=f'shoal-{name.strip("_")}-') as tmp:
        command = build_ext(Distribution({'ext_modules': [extension]}))
        command.build_temp = command.build_lib = tmp
        command.ensure_finalized()
        command.run()
        built = Path(command.get_ext_fullpath(module))
        for stale in package.glob(f'{name}.*.so'):
            stale.unlink()
        target = package / built.name
        shutil.copyfile(built, target)
    return target


def build_wire(source_root: Path) -> Path:
    """Build ``amqp/_wire.c`` next to its source; return its path."""
    package = source_root / 'shoal_broker' / 'amqp'
    ffi = cffi.FFI()
    ffi.cdef((package / '_wire.h').read_text())
    with tempfile.TemporaryDirectory(prefix='shoal-wire-') as tmp:
        generated = Path(tmp) / 'include'
        generated.mkdir()
        if (header := outcomes_header(package)) is not None:
            (generated / OUTCOMES_HEADER).write_text(header)
        ffi.set_source(
            MODULE,
            (package / '_wire.c').read_text(),
            include_dirs=[str(package), str(generated)],
            extra_compile_args=['-O2', '-Wall', '-std=c11'],
        )
        built = Path(ffi.compile(tmpdir=tmp, verbose=False))
        for stale in package.glob('_wire.*.so'):
            stale.unlink()
        target = package / built.name
        shutil.copyfile(built, target)
    return target


if __name__ == '__main__':
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent.parent / 'broker'
    sys.stdout.write(''.join(f'{path}\n' for path in build(root.resolve())))
