"""Atomic file writes: a temporary file in the same folder, fsync, rename.

A crash or a full disk leaves either the old file or the new one, never a
torn one. Disk-full becomes a `DiskFullError` that says what to do. Readers
that must never fail (the window, the layout's views) read with `read_json`.

Two processes that read a file, add to it and write it back (two evaluations of one
run) do so inside `locked(path)`, so neither writes over what the other added;
readers need no lock (a rename is atomic).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from engine.core.errors import DiskFullError, WorkspaceError, is_disk_full


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON value in a file; None when it is missing, unreadable or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _user_mode() -> int:
    """The mode a plain `open(..., "w")` would give: 0666 less the process umask."""
    try:  # Linux says it without changing it (os.umask would, for every thread)
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _raise_for_os_error(exc: OSError, path: Path) -> None:
    if is_disk_full(exc):
        raise DiskFullError(
            f"The disk holding {path.parent} is full; nothing was overwritten.",
            "Free some space and try again.",
        ) from exc
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        raise WorkspaceError(
            f"Cannot write {path}: permission denied.",
            "Choose a folder you can write to.",
        ) from exc
    raise WorkspaceError(f"Cannot write {path}: {exc.strerror or exc}.") from exc


@contextmanager
def atomic_path(path: str | os.PathLike[str], suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it over `path` on success.

    For writers that want a file name (soundfile, safetensors, torch.save).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix or ".tmp",
                                    dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        # mkstemp makes the file owner-only; the user's files get their usual mode
        os.chmod(tmp, _user_mode())
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        _raise_for_os_error(exc, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_folder(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a hidden temporary folder next to `path`; on success it replaces `path` as a
    whole, so a reader sees the old folder or the new one, never part of one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        # mkdtemp makes the folder owner-only; the user's folders get their usual mode
        mode = _user_mode()
        os.chmod(tmp, mode | (mode & 0o444) >> 2)  # searchable where readable
        old = tmp.with_name(tmp.name[:-len(".tmp")] + ".old")
        if target.exists():
            target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        _raise_for_os_error(exc, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write(path: str | os.PathLike[str], writer: Callable[[IO[bytes]], Any]) -> Path:
    target = Path(path)
    with atomic_path(target) as tmp, open(tmp, "wb") as fh:
        writer(fh)
        fh.flush()
    return target


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    return atomic_write(path, lambda fh: fh.write(data))


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


@contextmanager
def locked(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the exclusive lock of `path` (an advisory lock on `.<name>.lock` beside it)
    for a read-change-write; other holders wait. The lock ends with the process."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
