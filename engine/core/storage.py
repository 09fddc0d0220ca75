"""Where things live: paths as a person types them, and the storage that holds runs.

Paths as typed
    Every path a command or an API call takes goes through `user_path`: `~`
    is expanded and a relative path is made absolute against the current
    folder *once*, at the edge. Nothing downstream (Ray, pyarrow, a worker
    process whose current folder is elsewhere) ever sees a relative path.
    Symlinks are kept as they are (`os.path.abspath`, not `resolve()`), so
    the names a person sees in messages are the names they typed. Spaces and
    non-ASCII characters need nothing special: paths stay `str`/`Path` end to
    end and are never parsed as URIs. Arguments that may also be a hub id or
    a URI (`--base`, a speak source) go through `expand_arg`, which only
    expands a leading `~` and leaves everything else alone.

Storage of runs
    A run's checkpoints live in its *storage location*:
    - default: the voice's own `runs/<run>/` folder (one machine);
    - a shared folder every node mounts (`--storage /mnt/shared/voxshard`):
      the run lives in `<storage>/<voice>/<run>/`, and the voice's
      `runs/<run>` is a symlink to it, so export, speak and the app find it
      exactly like a local run;
    - an object-store URI (`--storage s3://bucket/prefix`, `gs://...`, any
      fsspec protocol whose package is installed): checkpoints go to
      `<uri>/<voice>/<run>/`; the voice's `runs/<run>/` keeps the config and
      the metrics, plus `storage.json` naming where the checkpoints are.
    `Location` gives the few pathlib operations the checkpoint code needs
    over fsspec, so the same code writes to a folder or to a bucket.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from engine.core.atomic import write_json

#: a scheme followed by ://, e.g. s3://, gs://, memory:// (file:// is a local path)
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
#: the pointer file in a local run folder whose checkpoints live at a URI
POINTER = "storage.json"


# -- paths as typed ---------------------------------------------------------------------------

def is_uri(text: str | os.PathLike[str]) -> bool:
    """True for `s3://...`-style locations (not for `file://`, which is a local path)."""
    m = _URI.match(os.fspath(text)) if isinstance(text, str | os.PathLike) else None
    return bool(m) and m.group(1).lower() != "file"


def user_path(path: str | os.PathLike[str]) -> Path:
    """A local path as a person typed it: `~` expanded, absolute, symlinks kept."""
    text = os.fspath(path)
    if isinstance(text, bytes):  # pragma: no cover - os.PathLike[bytes]
        text = os.fsdecode(text)
    if text.lower().startswith("file://"):
        text = urllib.parse.unquote(urllib.parse.urlparse(text).path)
    if not text.strip():
        raise ValueError("empty path")
    return Path(os.path.abspath(os.path.expanduser(text)))


def expand_arg(text: str) -> str:
    """For arguments that are a path *or* something else (a hub id, a URI):
    expand a leading `~`, make an existing relative path absolute, else unchanged."""
    text = str(text)
    if not text or is_uri(text):
        return text
    if text.startswith("~") or text.lower().startswith("file://"):
        return str(user_path(text))
    if os.path.exists(text):
        return str(user_path(text))
    return text


def storage_arg(text: str | os.PathLike[str] | None) -> str | None:
    """A storage setting as typed: a URI unchanged (trailing / dropped), or an absolute folder."""
    if text is None or not str(text).strip():
        return None
    text = os.fspath(text)
    if is_uri(text):
        return text.rstrip("/")
    return str(user_path(text))


# -- locations: a folder on disk or under a URI -----------------------------------------------

def as_location(place: str | os.PathLike[str] | Location) -> Path | Location:
    """`Path` for local places (all of pathlib works), `Location` for URIs."""
    if isinstance(place, Location):
        return place
    if isinstance(place, str) and is_uri(place):
        return Location(place)
    return Path(place)


class Location:
    """A file or folder under an fsspec URI, with the pathlib subset checkpoints use."""

    def __init__(self, url: str, _fs: Any = None) -> None:
        self.url = url.rstrip("/")
        self._fs = _fs

    # identity
    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"Location({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __truediv__(self, name: str) -> Location:
        return Location(f"{self.url}/{name}", self._fs)

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    @property
    def parent(self) -> Location:
        return Location(self.url.rsplit("/", 1)[0], self._fs)

    # the filesystem
    @property
    def fs(self) -> Any:
        if self._fs is None:
            import fsspec  # noqa: PLC0415

            self._fs, _ = fsspec.core.url_to_fs(self.url)
        return self._fs

    @property
    def fs_path(self) -> str:
        """The path inside `fs` (the URI without its scheme)."""
        return self.fs._strip_protocol(self.url)

    # pathlib's subset
    def exists(self) -> bool:
        return bool(self.fs.exists(self.fs_path))

    def is_dir(self) -> bool:
        return bool(self.fs.isdir(self.fs_path))

    def iterdir(self) -> Iterator[Location]:
        try:
            entries = self.fs.ls(self.fs_path, detail=False, refresh=True)
        except FileNotFoundError:
            return iter(())
        base = self.fs_path.rstrip("/")
        names = [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries
                 if str(e).rstrip("/") != base]
        return iter([self / n for n in names])

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        # object stores have no folders; fsspec's makedirs is a no-op there
        self.fs.makedirs(self.fs_path, exist_ok=True)

    def open(self, mode: str = "rb") -> IO[Any]:
        return self.fs.open(self.fs_path, mode)

    def read_bytes(self) -> bytes:
        return bytes(self.fs.cat_file(self.fs_path))

    def write_bytes(self, data: bytes) -> None:
        self.fs.pipe_file(self.fs_path, data)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.fs_path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def rmtree(self) -> None:
        try:
            self.fs.rm(self.fs_path, recursive=True)
        except FileNotFoundError:
            pass

    def stat_mtime(self) -> float:
        info = self.fs.info(self.fs_path)
        value = info.get("mtime") or info.get("LastModified") or info.get("last_modified")
        return float(value.timestamp() if hasattr(value, "timestamp") else value or 0.0)


def rmtree(place: Path | Location) -> None:
    """Delete a folder on disk or under a URI; a missing one is fine."""
    if isinstance(place, Location):
        place.rmtree()
        return

    shutil.rmtree(place, ignore_errors=True)


def ray_storage(place: str) -> tuple[str, Any]:
    """(storage_path, storage_filesystem) for Ray Train's RunConfig.

    Ray parses a bare storage path as a URI with pyarrow, which rejects
    relative paths and, in URIs, spaces and non-ASCII characters. Handing Ray
    the filesystem itself (pyarrow's local one, or fsspec's for a URI through
    pyarrow's FSSpecHandler, which also honours AWS_ENDPOINT_URL and the
    like) makes the path a plain path inside it, never parsed.
    """
    import pyarrow.fs as pafs  # noqa: PLC0415

    if is_uri(place):
        loc = Location(place)
        return loc.fs_path, pafs.PyFileSystem(pafs.FSSpecHandler(loc.fs))
    return str(user_path(place)), pafs.LocalFileSystem()


# -- where a run's checkpoints are ------------------------------------------------------------

def checkpoint_root(run_dir: str | os.PathLike[str] | Location) -> Path | Location:
    """Where the checkpoints of the run whose local folder is `run_dir` live.

    A local run folder with a `storage.json` pointer: the URI it names. A
    symlinked run folder (shared-folder storage): the folder it points to.
    Anything else (a plain folder, a URI): itself.
    """
    place = as_location(run_dir)
    if isinstance(place, Location):
        return place
    pointer = place / POINTER
    if pointer.is_file():
        try:
            uri = json.loads(pointer.read_text(encoding="utf-8"))["checkpoints"]
            return as_location(str(uri))
        except (OSError, ValueError, KeyError, TypeError):
            return place
    if place.is_symlink():
        return place.resolve()
    return place


def run_location(storage: str | None, runs_dir: Path, voice_name: str, run: str) -> str:
    """Where a new run's checkpoints go: `runs_dir/run`, or `<storage>/<voice>/<run>`."""
    if storage is None:
        return str(runs_dir / run)
    if is_uri(storage):
        return f"{storage.rstrip('/')}/{voice_name}/{run}"
    return str(Path(storage) / voice_name / run)


def link_run(run_dir: Path, location: str) -> None:
    """Make the voice's `runs/<run>` find a run stored elsewhere (symlink or pointer)."""
    if location == str(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
        return
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    if is_uri(location):
        # the bucket first: when it cannot be reached, nothing is left behind here
        Location(location).mkdir(parents=True, exist_ok=True)
        run_dir.mkdir(parents=True, exist_ok=True)

        write_json(run_dir / POINTER, {"checkpoints": location})
        return
    target = Path(location)
    target.mkdir(parents=True, exist_ok=True)
    if run_dir.is_symlink() or run_dir.exists():
        if run_dir.is_symlink() and run_dir.resolve() == target.resolve():
            return
        if run_dir.is_dir() and not run_dir.is_symlink() and not any(run_dir.iterdir()):
            run_dir.rmdir()
        else:
            raise FileExistsError(str(run_dir))
    run_dir.symlink_to(target, target_is_directory=True)
