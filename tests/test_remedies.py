"""Issue 51: a remedy is data, `Change(path, value, why)`: the memory plan and the failure
classifiers give changes; the CLI says their flags (and its real parser takes them), the
JSON events carry {"path", "value", "why"}, the Train page offers a button per change that
sets its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtWidgets import QLabel

from engine.cli.main import build_parser
from engine.config.change import Change, cli_lines
from engine.config.schema import lookup
from engine.config.train import TrainConfig
from gui.app import MainWindow
from gui.pages.train.page import TrainPage


def _tight_plan(tiny_model_dir: Path) -> object:
    """The tiny model's plan on a GPU with too little free memory for a batch of 8."""
    from engine.train.plan import make_plan

    cfg = TrainConfig().replace(parallel={"workers": 1}, data={"batch_size": 8})
    return make_plan(tiny_model_dir, cfg, device="cuda", free=[int(3.5 * (1 << 30))],
                     seq_len=1500, frames=1200, capability=(9, 0))


def test_a_plan_that_does_not_fit_gives_changes_the_cli_takes(tiny_model_dir: Path) -> None:
    plan = _tight_plan(tiny_model_dir)
    assert not plan.fits and plan.changes
    paths = [c.path for c in plan.changes]
    assert paths == ["data.batch_size", "data.grad_accum", "parallel.workers"], paths
    parser = build_parser()
    for change in plan.changes:
        _cls, name = lookup(change.path)  # a setting of the schema
        # its flags are what the real `train` parser takes, and give the change's value
        args = parser.parse_args(["train", "some-voice", "--base", "b", *change.flag_args()]
                                 if change.path != "model.base" else
                                 ["train", "some-voice", *change.flag_args()])
        assert getattr(args, name) == change.value, (change, args)
        assert "--" not in change.why  # the flags are the surface's, not the engine's text
    # the terminal's lines are the changes' flags; the window's sentence names none
    assert any("(--batch-size 4 --grad-accum 2)." in line for line in plan.advice)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["changes"] == [c.to_dict() for c in plan.changes]
    assert "--" not in data["words"] and "does not fit" in data["words"]


def test_a_change_is_checked_against_the_schema() -> None:
    with pytest.raises(ValueError, match="no setting"):
        Change("train.batch_size", 4, "no such section")
    with pytest.raises(ValueError, match="at least 1"):
        Change("data.batch_size", 0, "below its bound")
    assert Change("model.lora_predictor", False, "").flag_args() == ["--no-lora-predictor"]
    assert Change("run.keep_checkpoints", 3, "").flag_args() == ["--keep", "3"]
    assert Change("parallel.activation_checkpointing", True, "").label() == \
        "Activation checkpointing: on"


def test_an_out_of_memory_failure_is_classified_with_changes(tiny_model_dir: Path) -> None:
    """A worker's CUDA out-of-memory becomes a fatal error whose remedy is the plan's
    changes (or, without a plan, the changes that lower any run's memory); the driver's
    error carries them to every surface."""
    import torch

    from engine.train.failures import OUT_OF_MEMORY_CHANGES, out_of_memory_error
    from engine.train.launch import _as_training_error
    from engine.train.plan import relief

    plan = _tight_plan(tiny_model_dir)
    cfg = TrainConfig().replace(parallel={"workers": 1}, data={"batch_size": 8})
    advice = relief(plan, tiny_model_dir, cfg, "cuda")
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    fatal = out_of_memory_error(oom, 0, 3, None, advice)
    assert fatal.kind == "out_of_memory" and fatal.changes == tuple(advice)
    # as the worker's loop config carries them through Ray, or as dicts: the same
    assert out_of_memory_error(oom, 0, 3, None, [c.to_dict() for c in advice]).changes == \
        tuple(advice)
    bare = out_of_memory_error(oom, 1, 0, None, None)
    assert bare.changes == OUT_OF_MEMORY_CHANGES
    assert "model.trainable" in [c.path for c in bare.changes]
    import pickle

    assert pickle.loads(pickle.dumps(fatal)).changes == fatal.changes  # Ray pickles it
    err = _as_training_error(fatal)
    assert err.changes == fatal.changes
    # the API's hint names each change by its keyword; the CLI's by its flags
    assert "trainable='lora'" in err.hint
    assert any(line.endswith("(--trainable lora).") for line in cli_lines(err.changes))


def test_the_train_page_offers_a_button_per_change_that_sets_the_field(
        qtbot, window: MainWindow, tiny_model_dir: Path) -> None:
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    plan = _tight_plan(tiny_model_dir)
    # what the `plan` job's result carries: plain data, as the engine's JSON gives it
    result = json.loads(json.dumps({"plan": plan.to_dict(), "summary": plan.table()}))
    page.settings.workers.setValue(1)
    page._plan_done(result)
    assert page.plan_note.text().startswith("Memory plan: Each GPU needs")
    assert "--" not in page.plan_note.text()
    qtbot.waitUntil(page.remedies.isVisible, timeout=5000)
    offered = {c.path: b for c, b in page.remedies.buttons}
    assert list(offered) == ["parallel.workers"]  # a field of the form: a button
    # the batch size is not in the form: said in words, with why
    assert "Batch size: 4" in " ".join(w.text() for w in page.remedies.findChildren(QLabel))
    button = offered["parallel.workers"]
    assert button.text() == "Workers: 2"
    qtbot.mouseClick(button, qtbot_left())
    assert page.settings.workers.value() == 2
    assert not button.isEnabled()
    # the next command line has it
    assert "2" == page.settings.common_args("v")[page.settings.common_args("v").index(
        "--workers") + 1]
    # a plan that fits offers nothing
    page._plan_done({"plan": {**result["plan"], "fits": True}})
    assert not page.remedies.isVisible() and page.remedies.buttons == []


def test_a_failed_run_offers_its_changes(qtbot, window: MainWindow, voice: Path) -> None:
    """A run that ended in an error with changes (the engine's JSON error event): the page
    offers them as buttons."""
    import sys

    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    event = {"event": "error", "code": "training", "message": "Training ran out of GPU "
             "memory on rank 0 at step 3.", "hint": None, "template": "Training ran out of "
             "GPU memory on rank 0 at step 3.", "hint_template": None,
             "changes": [Change("parallel.activation_checkpointing", True,
                                "Recompute activations in backward").to_dict(),
                         Change("model.trainable", "lora", "Train LoRA adapters only"
                                ).to_dict()]}
    program = [sys.executable, "-c", f"import sys; print({json.dumps(event)!r}); sys.exit(1)"]
    job = page.start(program=program)
    assert job is not None
    with qtbot.waitSignal(job.finished, timeout=60000):
        pass
    assert job.outcome == "failed"
    qtbot.waitUntil(page.remedies.isVisible, timeout=5000)
    [(ckpt, ckpt_btn), (lora, lora_btn)] = page.remedies.buttons
    assert ckpt.path == "parallel.activation_checkpointing" and lora.path == "model.trainable"
    assert lora_btn.text() == "What trains: lora"
    assert not page.settings.act_ckpt.isChecked()
    qtbot.mouseClick(ckpt_btn, qtbot_left())
    assert page.settings.act_ckpt.isChecked()
    assert page.settings.trainable.currentData() != "lora"
    qtbot.mouseClick(lora_btn, qtbot_left())
    assert page.settings.trainable.currentData() == "lora"
    assert page.settings.lora_rank.isEnabled()  # the form follows as if chosen by hand


def qtbot_left() -> object:
    from PySide6.QtCore import Qt

    return Qt.MouseButton.LeftButton


def test_the_cli_refuses_a_run_that_does_not_fit_with_its_changes(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """The real CLI, on a machine with memory for one CPU worker's run and asked for two:
    it refuses before any cluster starts; its JSON error says the flags to a terminal
    (`hint`) and carries the change as data for the window."""
    import subprocess
    import sys

    from engine.train import driver
    from tests.helpers.voices import voice_with_clips

    voice = voice_with_clips(tmp_path, 8, 4.0)
    one = driver.train(voice, str(tiny_model_dir), workers=1, use_gpu=False, dry_run=True)
    room = one["plan"]["host_total"]  # the machine has this much: one worker fits, not two
    argv = ["--json", "train", str(voice), "--base", str(tiny_model_dir), "--workers", "2",
            "--cpu"]
    code = ("import engine.train.plan as plan\n"
            f"plan.host_available_memory = lambda: {room}\n"
            "from engine.cli.main import main\n"
            f"raise SystemExit(main({argv!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 1, done.stderr[-2000:]
    error = json.loads(done.stdout.strip().splitlines()[-1])
    assert error["event"] == "error" and error["message"].startswith("Training will not fit")
    fewer = [c for c in error["changes"] if c["path"] == "parallel.workers"]
    assert [c["value"] for c in fewer] == [1], error
    assert f"{fewer[0]['why']} (--workers 1)." in error["hint"]
    assert "--" not in (error["hint_template"] or "") + fewer[0]["why"]
