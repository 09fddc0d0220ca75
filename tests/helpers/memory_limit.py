"""A memory cgroup with a small limit, for a process the kernel should really run out of
memory in (the kernel's OOM killer, as on a machine without room). Needs a writable
cgroup memory controller (root on cgroup v1, or a delegated v2 tree); `memory_cgroup`
returns None where there is none, and the test that needs it skips."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")


class MemoryCgroup:
    """One cgroup: `add(pid)` moves a process in (new allocations are charged here)."""

    def __init__(self, path: Path, limit_file: str) -> None:
        self.path = path
        self.limit_file = limit_file

    def limit(self, nbytes: int) -> None:
        (self.path / self.limit_file).write_text(str(nbytes))

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        try:
            self.path.rmdir()  # only once its processes are gone
        except OSError:
            pass


def memory_cgroup() -> MemoryCgroup | None:
    """A fresh memory cgroup, or None where this machine does not let us make one."""
    name = f"voxshard-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    for root, limit in ((V1, "memory.limit_in_bytes"), (V2, "memory.max")):
        if not (root / ("memory.limit_in_bytes" if root == V1 else "cgroup.controllers")
                ).exists():
            continue
        if root == V2 and "memory" not in (root / "cgroup.subtree_control").read_text():
            continue
        try:
            (root / name).mkdir()
        except OSError:
            continue
        if (root / name / limit).exists():
            return MemoryCgroup(root / name, limit)
        (root / name).rmdir()
    return None
