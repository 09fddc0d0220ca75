"""Checkpoints saved in the background (issue 18): several writer threads, COMPLETE only
once the writes have finished, never two saves at once, and the state as it was when
the save was asked for."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


@pytest.fixture()
def group() -> Iterator[None]:
    import torch.distributed as dist

    if dist.is_initialized():  # someone else's group: use it as it is
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", rank=0, world_size=1,
                            init_method=f"tcp://127.0.0.1:{port}")
    try:
        yield
    finally:
        dist.destroy_process_group()


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    return model, opt


def test_background_save_completes_only_when_written(tmp_path: Path, group: None) -> None:
    from engine.layout.checkpoints import COMPLETE, list_checkpoints
    from engine.train.checkpoint import Checkpointer

    model, opt = _model()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    ck = Checkpointer(tmp_path / "run", 0, 1, keep=2, background=True, threads=3)
    first = ck.save(1, model, opt, None, {"epoch": 0, "position": 1}, wait=False)
    assert ck.pending and not (first / COMPLETE).exists()
    assert list_checkpoints(tmp_path / "run") == []  # not loadable before it is complete
    with torch.no_grad():  # training goes on: the save keeps the state it was given
        for p in model.parameters():
            p.add_(1.0)
    second = ck.save(2, model, opt, None, {"epoch": 0, "position": 2}, wait=False)
    # the second save started only after the first was finished and marked
    assert (first / COMPLETE).exists() and not (second / COMPLETE).exists()
    assert ck.finish() == second and (second / COMPLETE).exists() and not ck.pending
    # a save that must be complete when it returns (final, stopped) waits for its writes
    third = ck.save(3, model, opt, None, {"epoch": 0, "position": 3}, wait=True)
    assert (third / COMPLETE).exists() and not ck.pending
    # several writer threads: one shard file each
    assert len([f for f in os.listdir(first) if f.endswith(".distcp")]) == 3

    fresh, fresh_opt = _model()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    Checkpointer(tmp_path / "run", 0, 1).load(first, fresh, fresh_opt, None)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in saved.items())
    ck.close()


def test_written_says_when_the_writes_ended_without_completing_the_save(
        tmp_path: Path, group: None) -> None:
    """The trainer completes a background save once every rank's writes have ended
    (`written`, counted in the step's read back) instead of waiting at the next step."""
    import time

    from engine.layout.checkpoints import COMPLETE
    from engine.train.checkpoint import Checkpointer

    model, opt = _model()
    ck = Checkpointer(tmp_path / "run", 0, 1, keep=2, background=True)
    assert ck.written()  # nothing pending
    path = ck.save(1, model, opt, None, {"epoch": 0, "position": 1}, wait=False)
    deadline = time.monotonic() + 60
    while not ck.written() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ck.written() and ck.pending and not (path / COMPLETE).exists()
    assert ck.finish() == path and (path / COMPLETE).exists()
    ck.close()


# -- a background save beside the step's own collectives (issue 29) ----------------------

def _save_beside_collectives(rank: int, world: int, port: int, out_dir: str) -> None:
    import datetime
    import json

    import torch.distributed as dist

    from engine.train.checkpoint import Checkpointer

    torch.set_num_threads(1)
    # a mismatch between the two ranks' collectives shows as an error or a timeout
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{port}",
                            timeout=datetime.timedelta(seconds=60))
    try:
        model, opt = _model()
        ck = Checkpointer(Path(out_dir) / "run", rank, world, keep=2, background=True)
        sums = []
        for step in range(1, 7):
            ck.save(step, model, opt, None, {"epoch": 0, "position": step}, wait=False)
            # the next step goes on at once: gradient clipping and the loss scaler all-reduce
            # on the default group while the save's thread runs its own collectives
            for _ in range(30):
                t = torch.full((64,), float(rank + 1))
                dist.all_reduce(t)
                sums.append(float(t[0]))
        done = ck.finish()
        ck.close()
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(
            {"sums": sorted(set(sums)), "last": done.name if done else None}))
    finally:
        dist.destroy_process_group()


def test_background_save_runs_beside_the_steps_collectives(tmp_path: Path) -> None:
    """Two ranks: each background save's collectives run on the checkpointer's own
    group, so the main thread's all-reduces never pair with a save's gather."""
    import json

    import torch.multiprocessing as mp

    from engine.layout.checkpoints import list_checkpoints

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_save_beside_collectives, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        res = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert res["sums"] == [3.0], f"rank {rank}: an all-reduce met a save's collective"
        assert res["last"] == "checkpoint_step_0000006"
    assert [p.name for p in list_checkpoints(tmp_path / "run")][-1] == "checkpoint_step_0000006"
