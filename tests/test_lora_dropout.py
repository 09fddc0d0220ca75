"""`model.lora_dropout`: a setting added as its schema field and its use alone. The CLI's
flag, its bounds and its help, the API's keyword and `--set` follow from the schema
(tiny model, the real CLI in a subprocess)."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.config.train import ModelConfig
from engine.train.lora import target_modules
from engine.train.objective import build_objective
from tests.helpers.cli_events import cli_ends
from tests.helpers.voices import voice_with_clips


def _adapted(tiny_model_dir: Path, dropout: float) -> torch.nn.Linear:
    objective = build_objective(tiny_model_dir, ModelConfig(trainable="lora",
                                                             lora_dropout=dropout))
    _name, linear = next(target_modules(objective.talker))
    with torch.no_grad():  # B starts at zero: give the adapter an update to drop from
        linear.lora_B.normal_(generator=torch.Generator().manual_seed(0))
        linear.lora_A.normal_(generator=torch.Generator().manual_seed(1))
    return linear


def test_training_drops_adapter_inputs_and_speaking_never_does(tiny_model_dir: Path) -> None:
    plain = _adapted(tiny_model_dir, 0.0).train()
    x = torch.randn(4, 7, plain.in_features, generator=torch.Generator().manual_seed(2))
    assert torch.equal(plain(x), plain(x))  # nothing dropped: the same twice
    dropped = _adapted(tiny_model_dir, 0.5).train()
    torch.manual_seed(3)
    first, second = dropped(x), dropped(x)
    assert not torch.equal(first, second)  # a different half of x each time
    dropped.eval()  # speaking (and validation) use every input
    assert torch.equal(dropped(x), dropped(x))
    base = torch.nn.functional.linear(x, dropped.weight)
    whole = base + dropped.lora_scaling * (x @ dropped.lora_A.T @ dropped.lora_B.T)
    assert torch.allclose(dropped(x), whole, rtol=1e-4, atol=1e-3)
    assert not torch.allclose(first, whole, rtol=1e-4, atol=1e-3)
    # only the adapter's input is dropped: with no update, training gives the base's output
    with torch.no_grad():
        dropped.lora_B.zero_()
    assert torch.equal(dropped.train()(x), base)


def test_the_cli_takes_it_by_flag_and_by_path_and_checks_its_bounds(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    voice = voice_with_clips(tmp_path, 16, 4.0)
    shape = [str(voice), "--base", str(tiny_model_dir), "--workers", "1", "--trainable",
             "lora", "--dry-run"]
    flag, by_path, refused = cli_ends(["train", *shape, "--lora-dropout", "0.1"],
                                  ["train", *shape, "--set", "model.lora_dropout=0.2"],
                                  ["train", *shape, "--set", "model.lora_dropout=1"])
    assert flag["config"]["model"]["lora_dropout"] == 0.1
    assert flag["provenance"]["model.lora_dropout"] == "the request"
    assert by_path["config"]["model"]["lora_dropout"] == 0.2
    assert refused["event"] == "error" and "below 1" in refused["message"], refused
