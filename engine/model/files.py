"""Which files of an official model folder hold its weights.

Below `data`, `train` and `model.export`, which all read the safetensors
of a base model: one definition, and `data` need not import `train` for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from engine.core.errors import ModelError

_memo: dict[tuple[str, str, int, int], str] = {}


def weight_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a model folder: the index's shards, or model.safetensors."""
    base = Path(model_dir)
    index = base / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [base / n for n in names]
    if (base / "model.safetensors").is_file():
        return [base / "model.safetensors"]
    raise ModelError(f"{base} has no model.safetensors.")


def memo_per_version(path: Path, compute: Callable[[], str], kind: str) -> str:
    """`compute()` once per version of `path` (its size and modification time) and per
    `kind` of figure: a fingerprint over gigabytes of weights is worked out once per
    process, and two figures of one file (its weights', its speaker encoder's) never
    answer for each other."""
    st = path.stat()
    key = (kind, str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _memo:
        _memo[key] = compute()
    return _memo[key]
