"""The Train form says where the values it shows came from (issue 51): the engine's dry run
of the form's own command (`plan`, run in this process: a second engine process would cost
the suite seconds more) and a run's saved config carry each value's source, and a field
whose value is not the person's says whose it is."""

from __future__ import annotations

import os
from pathlib import Path

from engine.cli.main import build_parser, normalize_paths
from engine.config.layers import PROVENANCE_KEY
from engine.core.atomic import read_json, write_json
from engine.core.events import Emitter
from gui.app import MainWindow
from gui.pages.train import TrainPage
from tests.helpers.voices import copy_voice


def _dry_run(page: TrainPage) -> dict:
    """What the engine answers the page's `plan` command: the CLI's own parse and call."""
    args = build_parser().parse_args(["plan", *page.common_args()])
    normalize_paths(args)
    return args.func(args, Emitter())


def test_the_form_says_where_each_value_came_from(
        qtbot, window: MainWindow, workspace: Path, prepared_voice: Path,
        tiny_model_dir: Path, tmp_path: Path) -> None:
    voice = copy_voice(prepared_voice, workspace / "joe")
    window.resize(1100, 760)
    window.ctx.set_voice(voice)
    page: TrainPage = window.show_page(TrainPage)  # type: ignore[assignment]
    s = page.settings
    assert s.pick_base(str(tiny_model_dir))
    s.preset.setCurrentIndex(1)  # a preset: the form sends its name, the engine its values
    assert not s.provenance_note.isVisible()
    result = _dry_run(page)
    lr_source = result["provenance"]["optim.lr"]
    assert lr_source.startswith("the preset for"), result["provenance"]
    page._plan_done(result)
    # the learning rate is the preset's: its field and label say so, and the note
    tip = s.lr.toolTip()
    assert tip.endswith(f"This value: from {lr_source}.") and tip == s.labels["lr"].toolTip()
    assert s.provenance_note.isVisible()
    assert "earning rate" in s.provenance_note.text() and lr_source in s.provenance_note.text()
    # what the form sent (the base model) is the person's: no source on it
    assert result["provenance"]["model.base"] == "the request"
    assert "This value" not in s.base.toolTip()
    shots = Path(os.environ.get("VOXSHARD_SHOTS", tmp_path))
    s.scroll.ensureWidgetVisible(s.provenance_note)
    qtbot.wait(100)
    assert window.grab().save(str(shots / "train-provenance.png"))
    # a value changed by hand is the form's own: the sources no longer hold
    s.lr.setValue(s.lr.value() * 2)
    assert "This value" not in s.lr.toolTip() and not s.provenance_note.isVisible()

    # a run's saved config: its sources come back with its settings
    run = voice / "runs" / "2026-01-01_a"
    run.mkdir(parents=True)
    write_json(run / "config.json", {**result["config"],
                                     PROVENANCE_KEY: result["provenance"]})
    assert read_json(run / "config.json")[PROVENANCE_KEY]["optim.lr"] == lr_source
    page.refresh()
    qtbot.waitUntil(lambda: page.selected_run() is not None, timeout=10000)
    page.show_run(page.selected_run())
    assert s.lr.toolTip().endswith(f"This value: from {lr_source}.")
