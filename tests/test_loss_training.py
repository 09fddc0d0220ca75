"""The whole train-core chain in one process: real speech -> codes -> batches -> loss goes down.

Also the TrainConfig contract (validation, exact round-trip) that every run saves.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.config.train import DataConfig, ModelConfig, OptimConfig, TrainConfig
from engine.data.codes import extract_codes
from engine.train.objective import batch_to_device, setup_worker, trainable_parameters
from tests.helpers.voices import copy_voice


def test_config_round_trip_and_validation() -> None:
    cfg = TrainConfig(data=DataConfig(batch_size=4, reference_clip="t0001"),
                      optim=OptimConfig(lr=1e-4))
    again = TrainConfig.from_dict(cfg.to_dict())
    assert again == cfg and again.data.reference_clip == "t0001"
    assert cfg.replace(optim={"lr": 3e-6}).optim.lr == 3e-6
    with pytest.raises(ValueError, match=r"optim\.lr"):
        OptimConfig(lr=0)
    with pytest.raises(ValueError, match=r"model\.trainable"):
        ModelConfig(trainable="everything")
    with pytest.raises(ValueError, match="unknown field"):
        TrainConfig.from_dict({"optim": {"learning_rate": 1e-3}})
    with pytest.raises(ValueError, match=r"data\.batch_size"):
        TrainConfig.from_dict({"data": {"batch_size": 1}, "parallel": {"workers": 2}})
    with pytest.raises(ValueError, match="keep_checkpoints"):
        TrainConfig.from_dict({"run": {"keep_checkpoints": 1}})


@pytest.mark.parametrize("trainable", ["talker", "code_predictor", "talker_layers"])
def test_trainable_choice_decides_the_optimizer_parameters(tiny_model_dir: Path,
                                                           trainable: str) -> None:
    from engine.train.objective import build_objective

    objective = build_objective(tiny_model_dir, ModelConfig(trainable=trainable), device="meta")
    names = {n for n, p in objective.named_parameters() if p.requires_grad}
    assert "talker.model.text_embedding.weight" not in names
    has_cp = any(n.startswith("talker.code_predictor.") for n in names)
    has_layers = any(n.startswith("talker.model.layers.") for n in names)
    assert has_cp == (trainable != "talker_layers")
    assert has_layers == (trainable != "code_predictor")
    assert len(trainable_parameters(objective)) == len(names)


def test_training_on_real_speech_lowers_the_loss(prepared_voice: Path, tiny_model_dir: Path,
                                                 tmp_path: Path) -> None:
    voice = copy_voice(prepared_voice, tmp_path / "joe")
    extract_codes(voice, tiny_model_dir)
    cfg = TrainConfig(data=DataConfig(batch_size=4, val_fraction=0.2, val_min=2),
                      optim=OptimConfig(lr=2e-3))
    setup = setup_worker(tiny_model_dir, voice, cfg, "cpu")
    objective, data = setup.objective, setup.data
    opt = torch.optim.AdamW(trainable_parameters(objective), lr=cfg.optim.lr)

    def val_loss() -> float:
        with torch.no_grad():
            outs = [objective(batch_to_device(b, "cpu")) for b in data.val_batches()]
        t = sum(float(o["talker_sum"]) for o in outs) / sum(float(o["talker_tokens"])
                                                            for o in outs)
        s = sum(float(o["subtalker_sum"]) for o in outs) / sum(float(o["subtalker_tokens"])
                                                               for o in outs)
        return t + 0.3 * s

    before = val_loss()
    first = last = None
    for epoch in range(8):
        for batch in data.rank_batches(epoch):
            out = objective(batch_to_device(batch, "cpu"))
            out["loss"].backward()
            torch.nn.utils.clip_grad_norm_(trainable_parameters(objective), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            first = float(out["total"]) if first is None else first
            last = float(out["total"])
    assert first is not None and last is not None
    assert last < first - 1.0  # the training loss falls clearly
    assert val_loss() < before  # and generalises to held-out clips of the same voice
