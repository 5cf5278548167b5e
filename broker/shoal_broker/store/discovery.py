"""
How the ``shoal`` command finds a broker's embedded Redis without being told its URL.

The embedded Redis listens on a Unix socket in a private temporary directory whose name nobody
could guess, so a broker that starts one (``make run``) says where it is: a small JSON file
(``{"url": ..., "pid": ...}``, the broker's pid) in its data directory, and one in
``$XDG_RUNTIME_DIR/shoal/`` when that is set, both removed when the broker stops. The data
directory's is found from the directory ``make run`` ran in; the runtime directory's from
anywhere, when a single broker of the user runs. A file left by a broker killed with SIGKILL names
a pid that is gone, and is not taken.
"""

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = 'shoal-redis.json'
"""In the embedded Redis's data directory."""
RUNTIME_SUBDIR = 'shoal'
"""Under ``$XDG_RUNTIME_DIR``, holding ``<broker pid>.json``."""


def runtime_dir() -> Path | None:
    base = os.environ.get('XDG_RUNTIME_DIR')
    return Path(base) / RUNTIME_SUBDIR if base else None


def announce(data_dir: Path, url: str) -> list[Path]:
    """Write where this process's embedded Redis listens; returns the files written."""
    text = json.dumps({'url': url, 'pid': os.getpid()})
    places = [data_dir / FILE_NAME]
    runtime = runtime_dir()
    if runtime is not None:
        places.append(runtime / f'{os.getpid()}.json')
        for stale in runtime.glob('*.json'):  # of brokers killed before they could withdraw
            found = _load(stale)
            if found is not None and not _alive(found.pid):
                with contextlib.suppress(OSError):
                    stale.unlink()
    written = []
    for path in places:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            temporary = path.with_name(f'.{path.name}.{os.getpid()}')
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, 'w') as out:
                out.write(text)
            temporary.replace(path)  # a reader never sees half a file
        except OSError:  # a read-only runtime directory must not stop the broker
            continue
        written.append(path)
    return written


def withdraw(paths: list[Path]) -> None:
    """Remove the files ``announce`` wrote, unless another broker has since replaced one."""
    for path in paths:
        found = _load(path)
        if found is not None and found.pid == os.getpid():
            with contextlib.suppress(OSError):
                path.unlink()


@dataclass(frozen=True)
class _Found:
    path: Path
    url: str
    pid: int


def _load(path: Path) -> _Found | None:
    try:
        raw = json.loads(path.read_text())
        return _Found(path, str(raw['url']), int(raw['pid']))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that pid: not the broker that wrote it
        return False
    return True


@dataclass(frozen=True)
class Discovery:
    """What a look for a running broker found: its ``url`` (None: none found), and every place
    looked at with what was there, for the message when nothing is found."""

    url: str | None
    looked: tuple[str, ...]


def discover(data_dir: str) -> Discovery:
    """The Redis URL of a running broker with an embedded Redis: the one whose data directory
    is ``data_dir`` (relative to the working directory, as the broker takes it), else the one
    broker announced in the runtime directory."""
    looked = []
    path = Path(data_dir) / FILE_NAME
    found = _load(path)
    if found is not None and _alive(found.pid):
        return Discovery(found.url, (str(path),))
    looked.append(f'{path} ({_why(path, found)})')
    runtime = runtime_dir()
    if runtime is None:
        looked.append('$XDG_RUNTIME_DIR (not set)')
        return Discovery(None, tuple(looked))
    candidates = [f for p in sorted(runtime.glob('*.json')) if (f := _load(p)) is not None]
    live = [f for f in candidates if _alive(f.pid)]
    if len(live) == 1:
        return Discovery(live[0].url, (*looked, str(live[0].path)))
    if live:
        pids = ', '.join(str(f.pid) for f in live)
        looked.append(f'{runtime} ({len(live)} brokers run, pids {pids}: pick one)')
    else:
        looked.append(f'{runtime} (no running broker)')
    return Discovery(None, tuple(looked))


def _why(path: Path, found: _Found | None) -> str:
    if found is not None:
        return f'its broker, pid {found.pid}, is gone'
    return 'unreadable' if path.exists() else 'absent'
