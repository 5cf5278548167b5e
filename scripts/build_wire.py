"""
Compile ``broker/shoal_broker/amqp/_wire.c`` into the extension ``shoal_broker.amqp._wire``.

cffi in API mode: the C source is compiled with the declarations of ``_wire.h`` beside it, which
are all Python sees. Run by the package build (scripts/hatch_build.py) and by benchmarks that put
a source tree on PYTHONPATH (``python scripts/build_wire.py BROKER_SOURCE_ROOT``). Needs a C
compiler and the Python headers, which python-qpid-proton's own build needs as well.
"""

import shutil
import sys
import tempfile
from pathlib import Path

import cffi

MODULE = 'shoal_broker.amqp._wire'


def build(source_root: Path) -> Path:
    """Build the extension next to its C source under ``source_root``; return its path."""
    package = source_root / 'shoal_broker' / 'amqp'
    ffi = cffi.FFI()
    ffi.cdef((package / '_wire.h').read_text())
    ffi.set_source(
        MODULE,
        (package / '_wire.c').read_text(),
        include_dirs=[str(package)],
        extra_compile_args=['-O2', '-Wall', '-std=c11'],
    )
    with tempfile.TemporaryDirectory(prefix='shoal-wire-') as tmp:
        built = Path(ffi.compile(tmpdir=tmp, verbose=False))
        for stale in package.glob('_wire.*.so'):
            stale.unlink()
        target = package / built.name
        shutil.copyfile(built, target)
    return target


if __name__ == '__main__':
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent.parent / 'broker'
    sys.stdout.write(f'{build(root.resolve())}\n')
