"""Session results that the other pytest processes of one `run_tests.sh` reuse.

`packaging/run_tests.sh` points VOXSHARD_TEST_KEEP at a new folder for the suite's two
main processes and for the numeric-parity passes after them. A session fixture made
through `kept` is pickled there by the first process that asks for it; another process
loads it instead of making it again, and one that asks while it is being made waits
for it. So the tiny model, the prepared voice and the two trained runs are made once
per `run_tests.sh`, where each process made them before (the runs alone cost each
parity pass about 90 s on two cores). They are the tests' inputs (a model, a voice, a
finished run, all read-only to the tests), never one of the two computations a parity
test compares, so they need not be made under the kernel dispatch under test.
Without the variable (a plain `pytest`), every process makes its own.
"""

from __future__ import annotations

import fcntl
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
    # one process makes it while the others of the run wait for it (never nested: a
    # fixture's own fixtures are made before its body asks for this lock)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            value = pickle.loads(path.read_bytes())
            # every folder it names still there (pytest may have pruned an old basetemp)
            if all(p.exists() for p in _paths(value)):
                return value
        value = make()
        staged = path.with_name(f"{path.name}.{os.getpid()}")
        staged.write_bytes(pickle.dumps(value))
        os.replace(staged, path)
        return value
