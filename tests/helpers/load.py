"""A loaded machine, as CI's are: what a test runs beside the step it checks under load.

- `busy_cores`: one CPU-burning process per core (at the test's own priority) while the
  `with` block runs; they are ended by their pids when it exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: the burners' loop: pure Python, no I/O, so each holds one core until it is killed
_BURN = "while True:\n    pass\n"


@contextmanager
def busy_cores(count: int | None = None) -> Iterator[list[int]]:
    """`count` processes (default: one per core) that keep every core busy; their pids."""
    procs = [subprocess.Popen([sys.executable, "-c", _BURN])
             for _ in range(count or os.cpu_count() or 1)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)

