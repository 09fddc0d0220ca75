"""A full disk is recognised in one place (`engine.core.errors.is_disk_full`) for every
writer: an atomic write, an export, a distributed checkpoint. The errors here are real:
a write to /dev/full, and torch's own `CheckpointException` carrying a rank's failure."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from engine.core.errors import is_disk_full


def _real_enospc() -> OSError:
    try:
        with open("/dev/full", "wb", buffering=0) as fh:
            fh.write(b"x")
    except OSError as exc:
        return exc
    raise AssertionError("a write to /dev/full succeeded")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="this system has no /dev/full")
def test_every_shape_of_a_full_disk_is_recognised_and_nothing_else() -> None:
    full = _real_enospc()
    assert full.errno == errno.ENOSPC and is_disk_full(full)
    # behind another error, as a library re-raises it
    try:
        try:
            raise full
        except OSError as inner:
            raise RuntimeError("the writer failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    # a distributed checkpoint's failure on one rank: torch keeps (exception, trace) pairs
    assert is_disk_full(CheckpointException("save failed", {1: (full, None)}))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    # not the disk: permissions, another rank's other failure, nothing at all
    assert not is_disk_full(PermissionError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(CheckpointException("save failed", {0: (ValueError("bad"), None)}))
    assert not is_disk_full(None)
