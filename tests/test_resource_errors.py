"""A full disk and a device out of memory are each recognised in one place
(`engine.core.errors`): a full disk for every writer (an atomic write, an export, a
distributed checkpoint), a device's out-of-memory for training and speaking alike. The
errors here are the real ones: a write to /dev/full, torch's `CheckpointException` and
`OutOfMemoryError`, Ray's memory monitor's `OutOfMemoryError`."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from ray.exceptions import OutOfMemoryError as RayOutOfMemoryError
from torch.distributed.checkpoint.api import CheckpointException

from engine.core.errors import RAY_OOM_TEXT, is_device_out_of_memory, is_disk_full
from engine.train.failures import FatalTrainingError, is_out_of_memory


def _real_enospc() -> OSError:
    try:
        with open("/dev/full", "wb", buffering=0) as fh:
            fh.write(b"x")
    except OSError as exc:
        return exc
    raise AssertionError("a write to /dev/full succeeded")


def _behind(exc: BaseException) -> RuntimeError:
    """`exc` re-raised by a library as the cause of its own error."""
    try:
        try:
            raise exc
        except BaseException as inner:
            raise RuntimeError("the library failed") from inner
    except RuntimeError as outer:
        return outer


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="this system has no /dev/full")
def test_every_shape_of_a_full_disk_is_recognised_and_nothing_else() -> None:
    full = _real_enospc()
    assert full.errno == errno.ENOSPC and is_disk_full(full)
    assert is_disk_full(_behind(full))  # as a library re-raises it
    # a distributed checkpoint's failure on one rank: torch keeps (exception, trace) pairs
    assert is_disk_full(CheckpointException("save failed", {1: (full, None)}))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    # not the disk: permissions, another rank's other failure, nothing at all
    assert not is_disk_full(PermissionError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(CheckpointException("save failed", {0: (ValueError("bad"), None)}))
    assert not is_disk_full(None)


def test_a_device_out_of_memory_is_told_from_the_hosts() -> None:
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert is_device_out_of_memory(cuda)
    assert is_device_out_of_memory(_behind(cuda))  # as the synthesizer sees it
    assert is_device_out_of_memory(RuntimeError("CUDA error: out of memory"))
    # the host's memory monitor killing a worker is not the device's memory
    host = RayOutOfMemoryError(f"Task was {RAY_OOM_TEXT}. Memory on the node was 23GB")
    assert not is_device_out_of_memory(host) and not is_out_of_memory(host)
    assert not is_device_out_of_memory(RuntimeError("connection reset by peer"))
    # training's reading: the same rule, and its own sentence for it
    assert is_out_of_memory(cuda)
    assert is_out_of_memory(FatalTrainingError("out_of_memory", "Out of memory."))
    assert not is_out_of_memory(FatalTrainingError("disk_full", "The disk is full."))
