"""A run that cannot fail silently (issue 32 §4): after its first optimizer step every run
checks that each trained group gets finite, non-zero gradients and an update its weights
can hold, and reports the update/weight ratio per group. Real training of the tiny model
through the worker loop, without Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config.train import TrainConfig
from engine.train.builder import build_parts
from engine.train.failures import FatalTrainingError
from engine.train.trainer import ListSender, WorkerEnv, run_worker
from engine.train.updates import metric_key
from tests.helpers.batches import two_clip_batch
from tests.helpers.host_syncs import SyncCounter


@pytest.fixture
def voice(coded_voice: Path) -> Path:
    return coded_voice


def frozen_predictor_builder(cfg: Any, loop_config: dict[str, Any], rank: int,
                             world: int) -> Any:
    """The product's builder, whose code predictor then loses its gradients (a bug such as a
    wrapper freezing a submodule while --trainable says it trains)."""
    parts = build_parts(cfg, loop_config, rank, world)
    for p in parts.model.talker.code_predictor.parameters():
        p.requires_grad_(False)
    return parts


def _train(tmp_path: Path, voice: Path, model_dir: Path, steps: int = 2,
           builder: str | None = None, **sections: dict[str, Any]) -> ListSender:
    cfg = TrainConfig().replace(data={"batch_size": 2, "val_fraction": 0.0},
                                optim={"lr": 1e-3, "warmup_steps": 0},
                                run={"val_every": 0, "checkpoint_every": 1 << 30})
    if sections:
        cfg = cfg.replace(**sections)
    sender = ListSender()
    loop_config = {"config": cfg.to_dict(), "run_dir": str(tmp_path / "run"),
                   "total_steps": steps, "model_dir": str(model_dir), "voice_dir": str(voice),
                   "save_final": False, "builder": builder}
    run_worker(loop_config, WorkerEnv(rank=0, world=1, sender=sender))
    return sender


def _logs(sender: ListSender) -> list[str]:
    return [r["message"] for r in sender.of("log")]


def test_a_healthy_run_reports_its_check_and_the_update_ratios(
        tmp_path: Path, voice: Path, tiny_model_dir: Path) -> None:
    sender = _train(tmp_path, voice, tiny_model_dir)
    checked = [m for m in _logs(sender) if m.startswith("first step checked")]
    assert len(checked) == 1 and "talker update/weight" in checked[0], _logs(sender)
    assert "code predictor update/weight" in checked[0]
    for values in sender.of("train"):
        for group in ("talker", "code_predictor"):
            # Adam's first steps move each weight by about lr: far above fp32's rounding
            assert 1e-6 < values[metric_key(group)] < 1.0, values


def test_a_predictor_left_out_on_purpose_is_reported_frozen(
        tmp_path: Path, voice: Path, tiny_model_dir: Path) -> None:
    sender = _train(tmp_path, voice, tiny_model_dir, steps=1,
                    model={"trainable": "talker_layers"})
    assert any("code predictor frozen" in m for m in _logs(sender)), _logs(sender)
    assert metric_key("code_predictor") not in sender.of("train")[0]


def test_a_predictor_frozen_by_mistake_stops_the_run(
        tmp_path: Path, voice: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(FatalTrainingError) as err:
        _train(tmp_path, voice, tiny_model_dir, steps=1,
               builder="tests.test_train_updates:frozen_predictor_builder")
    # the setting it names is data, each surface words it (the CLI: --trainable)
    assert err.value.message == ("The code predictor is frozen although {model.trainable} is "
                                 "talker, which trains it, so its weights would never change.")


def test_a_sub_talker_loss_weight_of_0_stops_the_run(
        tmp_path: Path, voice: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(FatalTrainingError) as err:
        _train(tmp_path, voice, tiny_model_dir, steps=1, model={"subtalker_weight": 0.0})
    assert err.value.message == ("The code predictor's gradients are all zero after the first "
                                 "step because the sub-talker loss weight is 0, so only weight "
                                 "decay would change it.")
    assert "model.subtalker_weight" in (err.value.hint or "")


def test_an_update_below_the_weights_precision_stops_the_run(
        tmp_path: Path, voice: Path, tiny_model_dir: Path) -> None:
    """lr 1e-12 under bf16 compute (one gloo rank, so FSDP's mixed precision is on): Adam moves
    every weight by about 1e-12, which no float32 weight of the talker's size can hold."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        with pytest.raises(FatalTrainingError) as err:
            _train(tmp_path, voice, tiny_model_dir, steps=1, optim={"lr": 1e-12},
                   parallel={"precision": "bf16"})
    finally:
        dist.destroy_process_group()
    assert err.value.message.startswith("The first optimizer step changed "), err.value.message
    assert err.value.message.endswith(
        "of the talker's weights: its update (learning rate 1e-12 in this step) is below what "
        "float32 weights can represent, so training would change nothing."), err.value.message
    assert "{optim.lr}" in (err.value.hint or "")


def test_the_update_measurement_reads_nothing_back(tiny_model_dir: Path) -> None:
    from engine.train.objective import batch_to_device, build_objective, trainable_groups
    from engine.train.updates import UpdateProbe

    objective = build_objective(tiny_model_dir, None, device="cpu")
    batch = batch_to_device(two_clip_batch(tiny_model_dir), "cpu", pin=True)
    objective(batch)["loss"].backward()
    optimizer = torch.optim.AdamW([p for p in objective.parameters() if p.requires_grad],
                                  lr=1e-3)
    probe = UpdateProbe(trainable_groups(objective))
    with SyncCounter() as before:
        probe.before_step(check=True)
    optimizer.step()  # (AdamW reads its own step count back; not the probe's doing)
    with SyncCounter() as after:
        values = probe.after_step(torch.device("cpu"))
    assert before.hits == after.hits == [], before.hits + after.hits
    assert values.shape == (14,) and bool((values[[0, 7]] > 0).all())
