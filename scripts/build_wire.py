"""
Compile ``broker/shoal_broker/amqp/_wire.c`` into the extension ``shoal_broker.amqp._wire``.

cffi in API mode: the C source is compiled with the declarations below, which are all Python
sees. Run by the package build (scripts/hatch_build.py) and by benchmarks that put a source tree
on PYTHONPATH (``python scripts/build_wire.py BROKER_SOURCE_ROOT``). Needs a C compiler and the
Python headers, which python-qpid-proton's own build needs as well.
"""

import shutil
import sys
import tempfile
from pathlib import Path

import cffi

DECLARATIONS = """
int shoal_bind(void *const *functions, size_t count);
size_t shoal_push(void *transport, const char *data, size_t size);
ssize_t shoal_take_output(void *transport, char *out, size_t cap);
void *shoal_send(void *link, uint64_t tag, const char *header, size_t header_size,
                 const char *rest, size_t rest_size, int settle);
void shoal_settle_with(void *delivery, uint64_t state);
int64_t shoal_pending(void *delivery, int64_t max_size);
int shoal_receive(void *link, void *delivery, char *data, size_t size, int64_t *out);
int shoal_scan(const char *data, size_t size, int64_t *out);
int64_t shoal_skip(const char *data, size_t size, size_t pos);
int shoal_outcome(void *delivery);
"""

MODULE = 'shoal_broker.amqp._wire'


def build(source_root: Path) -> Path:
    """Build the extension next to its C source under ``source_root``; return its path."""
    package = source_root / 'shoal_broker' / 'amqp'
    ffi = cffi.FFI()
    ffi.cdef(DECLARATIONS)
    ffi.set_source(
        MODULE,
        (package / '_wire.c').read_text(),
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
