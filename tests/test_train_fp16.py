"""fp16 loss scaling on the worker loop (issue 18): one fused check and one read back per
step, a skipped step leaves the schedule where it was, and a run whose every step
overflows ends with one sentence instead of halving its scale in silence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.host_syncs import SyncCounter


def test_unscale_checks_every_gradient_with_one_read_back() -> None:
    from engine.train.precision import LossScaler

    scaler = LossScaler(init_scale=1024.0)
    params = [torch.nn.Parameter(torch.ones(5)) for _ in range(40)]
    for i, p in enumerate(params):
        p.grad = torch.full((5,), 1024.0 * (i + 1))
    with SyncCounter() as counter:
        finite = scaler.unscale_(params)
    assert finite
    assert counter.hits == ["aten::_local_scalar_dense"]  # one, not one per gradient
    assert all(torch.equal(p.grad, torch.full((5,), float(i + 1)))
               for i, p in enumerate(params))
    params[17].grad[3] = float("nan")
    assert not scaler.unscale_(params)


def fp16_builder(cfg: Any, loop_config: dict[str, Any], rank: int, world: int) -> Any:
    """A tiny fp16 model whose loss overflows on the steps listed in the loop config."""
    from engine.train.builder import TrainParts

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    bad_steps = set(loop_config["overflow_steps"])
    step = {"n": 0}

    def step_batches(epoch: int, position: int) -> list[Any]:
        step["n"] += 1
        return [torch.full((2, 3), float("inf") if step["n"] in bad_steps else 1.0)]

    def forward(m: Any, batch: Any) -> dict[str, Any]:
        loss = m(batch).pow(2).mean()
        one = torch.ones(())
        return {"loss": loss, "talker_sum": loss.detach(), "talker_tokens": one,
                "subtalker_sum": torch.zeros(()), "subtalker_tokens": one}

    return TrainParts(model=model, device=torch.device("cpu"), steps_per_epoch=1000,
                      step_batches=step_batches, forward=forward, precision="fp16")


def _run(tmp_path: Path, steps: int, overflow: list[int]) -> tuple[Any, Any]:
    from engine.config.train import TrainConfig
    from engine.train.trainer import ListSender, WorkerEnv, run_worker

    cfg = TrainConfig().replace(optim={"warmup_steps": 10, "lr": 1e-3},
                                run={"val_every": 0, "checkpoint_every": 1 << 30})
    sender = ListSender()
    loop_config = {"config": cfg.to_dict(), "run_dir": str(tmp_path / "run"),
                   "total_steps": steps, "builder": "tests.test_train_fp16:fp16_builder",
                   "overflow_steps": overflow, "save_final": False}
    return sender, lambda: run_worker(loop_config, WorkerEnv(rank=0, world=1, sender=sender))


def test_a_skipped_step_does_not_advance_the_schedule(tmp_path: Path) -> None:
    sender, go = _run(tmp_path, 5, overflow=[2, 3])
    go()
    lrs = [v["lr"] for v in sender.of("train")]
    scales = [v["precision/loss_scale"] for v in sender.of("train")]
    # warmup 10: lr(s) = (s + 1) / 10 x 1e-3 for the s-th step that changed the weights
    assert lrs == pytest.approx([1e-4, 2e-4, 2e-4, 2e-4, 3e-4], rel=1e-9)
    assert scales == [2.0 ** 16, 2.0 ** 15, 2.0 ** 14, 2.0 ** 14, 2.0 ** 14]


def test_a_run_that_always_overflows_ends_with_one_sentence(tmp_path: Path) -> None:
    from engine.train.failures import FatalTrainingError
    from engine.train.trainer import MAX_SKIPPED_STEPS

    sender, go = _run(tmp_path, 100, overflow=list(range(1, 101)))
    with pytest.raises(FatalTrainingError) as err:
        go()
    assert len(sender.of("train")) == MAX_SKIPPED_STEPS - 1  # the last one raised before reporting
    assert err.value.message == (f"fp16 overflowed on {MAX_SKIPPED_STEPS} optimizer steps in a "
                                 f"row (loss scale now {2.0 ** (16 - MAX_SKIPPED_STEPS):g}), so "
                                 "no step changed the weights.")
    assert "{parallel.precision} to bf16" in (err.value.hint or "")


def test_offloaded_gpu_workers_get_their_share_of_the_cores() -> None:
    from engine.train.resolve import worker_threads

    assert worker_threads(True, True, 2, 16) == 8  # the host runs their AdamW step
    assert worker_threads(True, False, 2, 16) is None  # GPU steps: the default (1)
    assert worker_threads(False, False, 3, 16) == 5
    assert worker_threads(True, True, 32, 16) == 1
