"""Session results that the later pytest processes of one `run_tests.sh` reuse.

`packaging/run_tests.sh` points VOXSHARD_TEST_KEEP at a new folder for the suite's
main pass and for the numeric-parity passes after it. A session fixture made through
`kept` is pickled there by the first process that makes it, and a later process loads
it instead of making it again: the tiny model, the prepared voice and the two trained
runs cost each parity pass about 90 s of training on two cores otherwise. They are the
tests' inputs (a model, a voice, a finished run), never one of the two computations a
parity test compares, so they need not be made under the kernel dispatch under test.
Without the variable (a plain `pytest`), every process makes its own.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

KEEP_ENV = "VOXSHARD_TEST_KEEP"

T = TypeVar("T")


def _paths(value: Any) -> list[Path]:
    if isinstance(value, Path):
        return [value]
    if isinstance(value, dict):
        return [p for v in value.values() for p in _paths(v)]
    if isinstance(value, list | tuple):
        return [p for v in value for p in _paths(v)]
    return []


def kept(name: str, make: Callable[[], T]) -> T:
    """`make()`, or what an earlier process of this test run made under `name`."""
    folder = os.environ.get(KEEP_ENV)
    if not folder:
        return make()
    path = Path(folder) / f"{name}.pickle"
    if path.is_file():
        value = pickle.loads(path.read_bytes())
        # every folder it names still there (pytest may have pruned an old basetemp)
        if all(p.exists() for p in _paths(value)):
            return value
    value = make()
    staged = path.with_name(f"{path.name}.{os.getpid()}")
    staged.write_bytes(pickle.dumps(value))
    os.replace(staged, path)  # a process reading it at the same time sees all or nothing
    return value
