"""Issue 33 through the window: the Train page's Reinforce step runs the real
`voxshard-engine reinforce` on the session's real run of the tiny model (`trained_run`,
copied first), by clicks: its charts get a point per iteration, Stop saves the iteration
under way, a second start is refused in one sentence, Resume continues from the stage's
own checkpoint, and the page says which checkpoints the stage added to the run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt

from engine.cli.main import build_parser
from engine.config.reinforce import ReinforceConfig
from engine.config.schema import field_help, label_of
from engine.core.atomic import write_json
from engine.layout.run import Run
from gui.app import MainWindow
from gui.pages.train import TrainPage
from gui.pages.train.reinforce import stage_steps
from tests.helpers.voices import copy_voice

#: an offline recogniser (the default one downloads)
ASR = ["--asr", "pocketsphinx"]


def _click(qtbot, button) -> None:
    assert button.isEnabled(), button.text()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def _open(qtbot, window: MainWindow, voice: Path) -> TrainPage:
    window.resize(1100, 760)
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    qtbot.waitUntil(lambda: page._history is None, timeout=20000)
    page.charts.setCurrentWidget(page.reinforce)
    return page


def _shots(qtbot, window: MainWindow, panel, shots: Path) -> None:
    """What it looks like at a laptop's size: the charts, then the settings open over them."""
    _click(qtbot, panel.more_btn)
    qtbot.wait(200)
    assert window.grab().save(str(shots / "train-reinforce.png"))
    _click(qtbot, panel.more_btn)
    qtbot.wait(200)
    assert window.grab().save(str(shots / "train-reinforce-settings.png"))


def test_reinforce_from_the_page_stop_refuse_resume(
        qtbot, window: MainWindow, workspace: Path, trained_run: dict[str, Any],
        tmp_path: Path) -> None:
    voice = copy_voice(trained_run["voice"], workspace / "joe")
    page = _open(qtbot, window, voice)
    panel = page.reinforce
    run_dir = voice / "runs" / "r1"
    assert page.selected_run() is not None and page.selected_run().path == run_dir
    assert not panel.resume_btn.isEnabled()  # no stage yet
    panel.extra_args = ASR
    # the stage's settings, as typed in the form: short renders, one sentence of two
    _click(qtbot, panel.more_btn)
    for name, value in (("prompts", 1), ("group", 2), ("max_frames", 12),
                        ("checkpoint_every", 25)):
        panel.fields[name].set_value(value)
    panel.iterations.setValue(50)
    _click(qtbot, panel.start_btn)
    job = panel.job
    # no training beside it, and training's Stop is not the stage's
    assert job is not None and not page.start_btn.isEnabled() and not page.stop_btn.isEnabled()
    qtbot.waitUntil(lambda: panel.charts.points("reinforce/reward") >= 1, timeout=300000)
    assert panel.state.text().startswith("Reinforcing, iteration ")
    assert panel.state.text().endswith(" of 50")
    for key in ("reinforce/similarity", "reinforce/kl", "reinforce/reward_spread"):
        assert panel.charts.points(key) >= 1, key
    _click(qtbot, panel.stop_btn)
    with qtbot.waitSignal(job.finished, timeout=300000):
        pass
    assert job.outcome == "cancelled", job.error
    assert panel.state.text().startswith("Stopped after iteration"), panel.state.text()
    done = panel.charts.points("reinforce/reward")
    steps = stage_steps(run_dir)
    assert len(steps) == 1 and f"added step {steps[0]} to r1" in panel.note.text()
    assert panel.resume_btn.isEnabled() and page.start_btn.isEnabled()

    # a second stage on the same run: the engine refuses, the page says so in a sentence
    state = _refused(qtbot, panel)
    assert "already has a reinforce stage" in state, state

    # Resume: from the stage's checkpoint, one iteration more
    panel.iterations.setValue(done + 1)
    _click(qtbot, panel.resume_btn)
    resumed = panel.job
    assert resumed is not None
    assert panel.charts.points("reinforce/reward") == done  # the stage so far, on screen
    with qtbot.waitSignal(resumed.finished, timeout=300000):
        pass
    assert resumed.outcome == "succeeded", resumed.error
    qtbot.waitUntil(lambda: panel.charts.points("reinforce/reward") == done + 1, timeout=10000)
    assert panel.state.text().startswith("Reinforced run r1"), panel.state.text()
    assert stage_steps(run_dir)[-1] == steps[0] + 1
    assert f"steps {steps[0]} and {steps[0] + 1} to r1" in panel.note.text()
    # the run on disk says the same as the chart: one row per iteration
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["iteration"] for r in rows if r.get("kind") == "reinforce"} == \
        set(range(1, done + 2))

    _shots(qtbot, window, panel, Path(os.environ.get("VOXSHARD_SHOTS", tmp_path)))


def test_a_run_without_checkpoint_cannot_be_reinforced(
        qtbot, window: MainWindow, voice: Path) -> None:
    run = voice / "runs" / "2026-01-01_a"
    run.mkdir(parents=True)
    write_json(run / "config.json", {"run": {"steps": 10}})
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1,
                                                   "loss/train": 9.0}) + "\n")
    page = _open(qtbot, window, voice)
    panel = page.reinforce
    assert not panel.start_btn.isEnabled() and not panel.resume_btn.isEnabled()
    assert panel.note.text() == ("The run 2026-01-01_a has no checkpoint yet, so there is "
                                 "nothing to reinforce: train it (or resume it) first.")
    # a setting the stage would refuse: one sentence, nothing started
    panel.fields["reward"].set_value("not a spec")
    try:
        panel.settings_args()
    except ValueError as exc:
        assert str(exc).startswith("Invalid reinforce setting: reinforce.reward: must be "), exc
    else:
        raise AssertionError("a reward of 'not a spec' was taken")
    assert panel.start() is None and panel.job is None


def test_the_settings_are_the_schemas_fields(qtbot, window: MainWindow, voice: Path) -> None:
    """Each of the stage's settings is its config field: the label, unit, bounds and help
    the schema gives it; a number typed out of its bounds is said in the engine's words."""
    panel = _open(qtbot, window, voice).reinforce
    helps = field_help(ReinforceConfig)
    for name, field in panel.fields.items():
        assert panel.labels[name].text() == label_of(ReinforceConfig, name), name
        assert field.widget.toolTip() == helps[name] != "", name
        assert field.value() == getattr(ReinforceConfig(), name), name
    group, frames = panel.fields["group"].widget, panel.fields["max_frames"].widget
    assert group.minimum() == 2 and group.suffix() == " per sentence"
    assert frames.minimum() == 2 and frames.suffix() == " frames"
    rates = panel.fields["rate_low"].widget, panel.fields["rate_high"].widget
    assert rates[0].maximum() < 1 < rates[1].minimum()
    assert panel.iterations.minimum() == 1 and panel.iterations.suffix() == " iterations"
    _click(qtbot, panel.more_btn)
    group.lineEdit().selectAll()
    qtbot.keyClicks(group.lineEdit(), "1")
    assert panel.fields["group"].problem == "Renders must be at least 2, not 1; it stays 4."
    # the flags the form sends are the CLI's, and only the changed ones
    panel.fields["rate_high"].set_value(1.5)
    args = panel.settings_args()
    assert args == ["--iterations", "100", "--rate-high", "1.5"], args
    assert build_parser().parse_args(["reinforce", str(voice), *args]).rate_high == 1.5


def test_a_reinforced_run_shows_its_stage_read_back(
        qtbot, window: MainWindow, voice: Path, tmp_path: Path) -> None:
    """After a restart the page draws the stage from the run's folder: one point per
    iteration (a resumed stage's repeated iteration counted once), its checkpoints named."""
    run = voice / "runs" / "2026-01-01_a"
    run.mkdir(parents=True)
    write_json(run / "config.json", {"run": {"steps": 10}})
    rows = [{"kind": "train", "step": s, "loss/train": 9.0 - s / 10} for s in range(1, 11)]
    for it in (1, 2, 3, 3, 4):  # iteration 3 again: the stage resumed from iteration 2
        rows.append({"kind": "reinforce", "step": 10 + it, "iteration": it,
                     "reinforce/reward": -1.5 + it / 10, "reinforce/similarity": 0.1 * it,
                     "reinforce/wer": 0.5, "reinforce/capped": 1.0, "reinforce/rate_off": 0.0,
                     "reinforce/kl": 1e-3 * it, "reinforce/reward_spread": 0.02})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for step, stage in ((10, "train"), (12, "reinforce"), (14, "reinforce")):
        ckpt = run / f"checkpoint_step_{step:07d}"
        ckpt.mkdir()
        (ckpt / "COMPLETE").write_text("")
        write_json(ckpt / "trainer.json", {"stage": stage})
    page = _open(qtbot, window, voice)
    panel = page.reinforce
    assert panel.charts.points("reinforce/reward") == 4
    assert panel.charts.points("reinforce/kl") == 4
    assert panel.state.text() == "Reinforced: 4 iteration(s) so far."
    assert "added steps 12 and 14 to 2026-01-01_a" in panel.note.text()
    assert panel.start_btn.isEnabled() and panel.resume_btn.isEnabled()
    # the stage's rows are not training steps: the run trained 10 of its 10
    assert "(step 10/10, 3 checkpoints)" in page.run_picker.currentText()
    assert page.stat_labels["step"].text() == "10 / 10"
    # the style settings are for a run trained with styles: shown for one, and sent
    assert all(panel.fields[n].widget.isHidden() for n in ("style_weight", "style_share"))
    write_json(run / "data.json", {"styles": ["Speak slowly."]})
    panel.show_run(run)
    assert not any(panel.fields[n].widget.isHidden() for n in ("style_weight", "style_share"))
    panel.fields["style_weight"].set_value(0.4)
    args = panel.settings_args()
    assert args[args.index("--style-weight") + 1] == "0.4"
    assert build_parser().parse_args(["reinforce", str(voice), *args]).style_weight == 0.4
    qtbot.wait(200)
    shots = Path(os.environ.get("VOXSHARD_SHOTS", tmp_path))
    assert window.grab().save(str(shots / "train-reinforce-read-back.png"))


def _refused(qtbot, panel) -> str:
    _click(qtbot, panel.start_btn)
    job = panel.job
    assert job is not None
    with qtbot.waitSignal(job.finished, timeout=120000):
        pass
    assert job.outcome == "failed", job.outcome
    return panel.state.text()


def test_the_tab_chooses_the_ray_path_and_says_what_the_engine_refuses(
        qtbot, window: MainWindow, workspace: Path, trained_run: dict[str, Any],
        lora_run: dict[str, Any]) -> None:
    voice = copy_voice(trained_run["voice"], workspace / "joe")
    page = _open(qtbot, window, voice)
    panel = page.reinforce
    panel.extra_args = ASR
    _click(qtbot, panel.more_btn)
    for name, value in (("prompts", 1), ("group", 2), ("max_frames", 12)):
        panel.fields[name].set_value(value)
    # in the engine's process by default: no Ray flag, no address to give
    assert panel.workers.text() == "this process" and not panel.address.isEnabled()
    assert "--workers" not in panel.settings_args()
    panel.workers.setFocus()
    for _ in range(3):
        qtbot.keyClick(panel.workers, Qt.Key.Key_Up)
    assert panel.address.isEnabled()
    qtbot.keyClicks(panel.address, "127.0.0.1:6379")
    assert panel.settings_args()[-4:] == ["--workers", "3", "--address", "127.0.0.1:6379"]
    # 1 x 2 renders over 3 workers: the engine refuses before it reaches any cluster
    said = _refused(qtbot, panel)
    assert said.startswith("Reinforce did not run: 1 x 2 renders per iteration do not split "
                           "evenly over 3 workers."), said
    assert not stage_steps(voice / "runs" / "r1")

    # a LoRA run's stage runs in this process only: on Ray workers, one sentence
    lora = copy_voice(lora_run["voice"], workspace / "ann")
    page = _open(qtbot, window, lora)
    panel = page.reinforce
    panel.extra_args = ASR
    panel.workers.setValue(2)
    said = _refused(qtbot, panel)
    assert said == ("Reinforce did not run: The run lora trained LoRA adapters, which the "
                    "reinforce stage updates in this process only, not on Ray workers."), said


def _reinforced_run(voice: Path, rewards: list[float]) -> Path:
    """A trained run (checkpoint at step 10, no evaluation) with a stage of len(rewards)
    iterations read back from its metrics.jsonl."""
    run = voice / "runs" / "2026-01-01_a"
    run.mkdir(parents=True)
    write_json(run / "config.json", {"run": {"steps": 10}})
    rows = [{"kind": "train", "step": s, "loss/train": 9.0 - s / 10} for s in range(1, 11)]
    for it, reward in enumerate(rewards, start=1):
        rows.append({"kind": "reinforce", "step": 10 + it, "iteration": it,
                     "reinforce/reward": reward, "reinforce/similarity": 0.05 * it,
                     "reinforce/wer": 0.8, "reinforce/capped": 1.0, "reinforce/rate_off": 0.2,
                     "reinforce/kl": 2e-4 * it, "reinforce/reward_spread": 0.3 + 0.01 * it})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ckpt = run / "checkpoint_step_0000010"
    ckpt.mkdir()
    (ckpt / "COMPLETE").write_text("")
    write_json(ckpt / "trainer.json", {"stage": "train"})
    return run


def _plot_height(plot) -> float:
    return plot.getViewBox().sceneBoundingRect().height()


def test_the_tab_is_readable_at_the_smallest_window(
        qtbot, window: MainWindow, voice: Path, tmp_path: Path) -> None:
    """Issue 45: at 1100x760 the charts have room and their ranges come from the data (a
    reward of -1.54 is on screen), the KL and spread axes do not run into each other, the
    settings open to every row, and the words name the checkpoint the stage starts from."""
    _reinforced_run(voice, [-1.54, -1.31, -1.42])
    page = _open(qtbot, window, voice)
    panel = page.reinforce
    charts = panel.charts
    # the charts' layout settles over a few turns of the event loop (slower on a busy box)
    qtbot.waitUntil(lambda: _plot_height(charts.reward_plot) >= 100, timeout=10000)
    assert charts.points("reinforce/reward") == 3
    for plot in charts.plots:
        assert _plot_height(plot) >= 65, (plot.titleLabel.text, _plot_height(plot))
    assert _plot_height(charts.reward_plot) >= 100
    # issue 50: in the tab, not past its bottom (a 240 px minimum in 120-150 px of room
    # left the lowest reward on the edge and the spread chart out of view)
    bottom = charts.mapTo(panel, charts.rect().bottomLeft()).y()
    assert bottom <= panel.contentsRect().bottom() + 1, (bottom, panel.contentsRect())
    for plot in charts.plots:  # and whole: none cut off at the tab's right edge
        assert plot.sceneBoundingRect().right() <= charts.width() + 1, plot.titleLabel.text
    # each y range holds its data, and spans it (not a fixed 0..1)
    for plot, name in ((charts.reward_plot, "reinforce/reward"),
                       (charts.kl_plot, "reinforce/kl"),
                       (charts.spread_plot, "reinforce/reward_spread")):
        _x, y = charts.curves[name].getData()
        (_x0, _x1), (y0, y1) = plot.getViewBox().viewRange()
        assert y0 <= min(y) and max(y) <= y1, (name, y0, y1, list(y))
    (_, _), (y0, y1) = charts.reward_plot.getViewBox().viewRange()
    # from the lowest reward (-1.54) to the highest term (1.0, every render capped), padded
    assert y0 <= -1.54 and 1.0 <= y1 and y1 - y0 <= 1.25 * 2.54, (y0, y1)
    # the KL chart's ticks and the spread chart's do not overlap: one above the other
    kl_axis = charts.kl_plot.getAxis("left").sceneBoundingRect()
    spread_axis = charts.spread_plot.getAxis("left").sceneBoundingRect()
    assert kl_axis.bottom() <= spread_axis.top() + 1 or spread_axis.bottom() <= kl_axis.top() \
        + 1 or kl_axis.right() <= spread_axis.left(), (kl_axis, spread_axis)
    # the stage starts from the newest training checkpoint: no evaluation chose a best
    assert panel.note.text() == ("Starts from step 10, the newest checkpoint: no evaluation "
                                 "yet."), panel.note.text()
    shots = Path(os.environ.get("VOXSHARD_SHOTS", tmp_path))
    assert window.grab().save(str(shots / "train-reinforce-1100.png"))
    # the settings, open: a column as wide as the tab (nothing cut at its right edge) that
    # scrolls to every row, and the charts keep a readable height
    _click(qtbot, panel.more_btn)
    inner = panel.form.widget()
    qtbot.waitUntil(lambda: panel.form.viewport().width() >= inner.minimumSizeHint().width(),
                    timeout=10000)
    for field in (f for f in panel.fields.values() if not f.widget.isHidden()):
        panel.form.ensureWidgetVisible(field.widget)
        top = field.widget.mapTo(panel.form.viewport(), field.widget.rect().topLeft()).y()
        assert 0 <= top and top + field.widget.height() <= panel.form.viewport().height(), \
            field.name
    panel.form.ensureWidgetVisible(panel.address)
    assert _plot_height(charts.reward_plot) >= 90
    assert window.grab().save(str(shots / "train-reinforce-1100-settings.png"))


def test_the_note_names_the_evaluations_best(qtbot, window: MainWindow, voice: Path) -> None:
    run = _reinforced_run(voice, [])
    for step in (4, 8):
        ckpt = run / f"checkpoint_step_{step:07d}"
        ckpt.mkdir()
        (ckpt / "COMPLETE").write_text("")
        write_json(ckpt / "trainer.json", {"stage": "train"})
    write_json(run / "evaluation" / "evaluation.json", {"best": {"step": 8}})
    page = _open(qtbot, window, voice)
    assert page.reinforce.note.text() == "Starts from step 8, the evaluation's best."


def test_the_page_says_the_stage_and_what_a_reinforced_run_allows(
        qtbot, window: MainWindow, voice: Path) -> None:
    """Issue 50: a reinforced run's training is not offered for Resume (the engine refuses
    it: `Run.resume_refusal`) and its note counts training's steps, not the stage's; while
    a stage runs the page says so and Export and Evaluate wait; a new run's Reinforce tab
    is its own (empty), not the last run's."""
    run = _reinforced_run(voice, [-1.5, -1.4, -1.3, -1.2])
    for step in (12, 14):  # the stage's checkpoints, after training's 10
        ckpt = run / f"checkpoint_step_{step:07d}"
        ckpt.mkdir()
        (ckpt / "COMPLETE").write_text("")
        write_json(ckpt / "trainer.json", {"stage": "reinforce"})
    page = _open(qtbot, window, voice)
    panel = page.reinforce
    assert page.selected_run() is not None and page.selected_run().path == run
    page.steps.setValue(10)
    assert not page.resume_btn.isEnabled()
    note = page.settings.run_note.text()
    assert "went on into the reinforce stage" in note and "14 steps" not in note
    assert "Resume on the Reinforce tab" in note and "--" not in note
    page.steps.setValue(30)  # more steps would not resume it either
    assert not page.resume_btn.isEnabled()
    assert page.export_btn.isEnabled() and page.evaluate_btn.isEnabled()
    # the stage (the real engine: this run has no model to load, so it fails soon)
    panel.extra_args = ASR
    job = panel.start(resume=True)
    assert job is not None
    assert page.state_label.text().startswith("Reinforce stage running")
    assert not page.export_btn.isEnabled() and not page.evaluate_btn.isEnabled()
    assert not page.resume_btn.isEnabled() and not page.start_btn.isEnabled()
    with qtbot.waitSignal(job.finished, timeout=120000):
        pass
    assert page.state_label.text() == "Reinforce stage: failed"
    assert page.export_btn.isEnabled() and page.evaluate_btn.isEnabled()
    # a new run: its Reinforce tab starts empty
    assert panel.charts.points("reinforce/reward") == 4
    new = page.start(program=[sys.executable, "-c", "import time; time.sleep(1)"])
    assert new is not None
    assert panel.charts.points("reinforce/reward") == 0
    assert panel.state.text() == "Not reinforced yet."
    with qtbot.waitSignal(new.finished, timeout=60000):
        pass


def test_a_stage_keeps_its_iterations_after_a_restart(
        qtbot, window: MainWindow, voice: Path) -> None:
    """Issue 50: a run's stage was asked for 40 iterations; after a restart the box said the
    voice's 100 again (a Resume would have gone on to 100). A run without a stage shows the
    voice's."""
    run = _reinforced_run(voice, [-1.5, -1.4])
    report = Run(run).reinforce_report
    report.parent.mkdir(parents=True)
    write_json(report, {"iterations": 2, "stopped": True, "config": {"iterations": 40}})
    page = _open(qtbot, window, voice)
    assert Path(page.selected_run().path) == run
    assert page.reinforce.iterations.value() == 40
    other = voice / "runs" / "2026-01-02_b"
    other.mkdir()
    write_json(other / "config.json", {"run": {"steps": 10}})
    page.refresh()
    i = page.run_picker.findData(str(other))
    page.run_picker.setCurrentIndex(i)
    page.run_picker.activated.emit(i)
    assert page.reinforce.iterations.value() == 100


def test_the_charts_stay_in_the_tab_when_the_plan_is_shown(
        qtbot, window: MainWindow, voice: Path) -> None:
    """Issue 50: with the memory plan's note above the tabs at 1100x760, the tab had
    120-150 px left and the charts kept 240: the spread chart was out of view."""
    _reinforced_run(voice, [-1.54, -1.31, -1.42])
    page = _open(qtbot, window, voice)
    page.plan_note.setText("Memory plan: " + "per worker 3.2 GiB of 80 GiB, " * 12)
    page.plan_note.show()
    panel, charts = page.reinforce, page.reinforce.charts

    def bottom() -> int:
        return charts.mapTo(panel, charts.rect().bottomLeft()).y()

    qtbot.waitUntil(lambda: bottom() <= panel.contentsRect().bottom() + 1, timeout=10000)
    for plot in charts.plots:  # each whole inside the charts
        assert plot.sceneBoundingRect().bottom() <= charts.height() + 1, plot.titleLabel.text
    (_, _), (y0, _y1) = charts.reward_plot.getViewBox().viewRange()
    assert y0 <= -1.54
