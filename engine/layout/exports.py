"""A voice's exported models and renders on disk.

```
<voice>/exports/<name>/config.json               an official-format model folder
<voice>/exports/<name>/VOXSHARD_EXPORT.json      which run and checkpoint it came from
<voice>/renders/<name>.wav (+ .json)             speech rendered from the voice
<voice>/renders/compare-<time>/index.json        a finished checkpoint comparison
```

An export is written under a hidden name and renamed in when complete, so a
folder with its `config.json` is a whole model.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

EXPORTS_DIR = "exports"
RENDERS_DIR = "renders"
#: the file every official model folder has; an export is complete once it is there
EXPORT_CONFIG = "config.json"
#: what Voxshard records beside an export: run, checkpoint, speaker
EXPORT_INFO = "VOXSHARD_EXPORT.json"
COMPARE_PREFIX = "compare-"
COMPARE_INDEX = "index.json"


def exports_dir(voice_dir: str | os.PathLike[str]) -> Path:
    return Path(voice_dir) / EXPORTS_DIR


def renders_dir(voice_dir: str | os.PathLike[str]) -> Path:
    return Path(voice_dir) / RENDERS_DIR


def is_model_folder(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is an official-format model folder (a base model or an export): it
    holds the model's config.json."""
    return (Path(path) / EXPORT_CONFIG).is_file()


def is_export(folder: Path) -> bool:
    return not folder.name.startswith(".") and is_model_folder(folder)


def list_exports(voice_dir: str | os.PathLike[str]) -> list[Path]:
    """The voice's complete exports, newest first (by when their model was written)."""
    return export_folders(voice_dir, is_export, EXPORT_CONFIG)


def export_folders(voice_dir: str | os.PathLike[str], complete: Callable[[Path], bool],
                   stamp: str) -> list[Path]:
    """The folders of exports/ that are `complete`, newest first by their file `stamp`
    (full models here, adapters in engine.layout.tiers)."""
    try:
        found = [p for p in exports_dir(voice_dir).iterdir() if complete(p)]
    except OSError:
        return []
    return sorted(found, key=lambda p: (-(p / stamp).stat().st_mtime, p.name))


def latest_export(voice_dir: str | os.PathLike[str]) -> Path | None:
    """Which export a command means when the user names none: the newest."""
    found = list_exports(voice_dir)
    return found[0] if found else None


def comparisons(voice_dir: str | os.PathLike[str]) -> list[Path]:
    """Finished checkpoint comparisons (folders with their index), oldest first."""
    pattern = f"{COMPARE_PREFIX}*/{COMPARE_INDEX}"
    return sorted(p.parent for p in renders_dir(voice_dir).glob(pattern))


def new_render_path(voice_dir: str | os.PathLike[str], suffix: str = ".wav") -> Path:
    """Where a render made now goes in the voice's renders/ (the folder made): the time in
    its name sorts them, and a second render in the same second gets -1, -2, ..."""
    renders = renders_dir(voice_dir)
    renders.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out, n = renders / f"{stamp}{suffix}", 1
    while out.exists():
        out, n = renders / f"{stamp}-{n}{suffix}", n + 1
    return out


def new_comparison_dir(voice_dir: str | os.PathLike[str]) -> Path:
    """Where a comparison started now goes (the time in its name sorts them)."""
    return renders_dir(voice_dir) / time.strftime(f"{COMPARE_PREFIX}%Y%m%d-%H%M%S")
