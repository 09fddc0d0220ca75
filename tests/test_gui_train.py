"""The Train monitor: eight GPUs, the layout, run picking and honest endings."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QRectF

from engine.config.train import TrainConfig
from engine.core.atomic import write_json
from gui.app import MainWindow
from gui.pages.train import TrainPage, attach_processes, parse_nvidia_smi
from tests.helpers.processes import flood_program


def _stream(qtbot, page: TrainPage, **kwargs) -> None:
    job = page.start(program=flood_program(**kwargs))
    assert job is not None
    with qtbot.waitSignal(job.finished, timeout=120000):
        pass
    qtbot.waitUntil(lambda: not page.redraw_timer.isActive(), timeout=10000)


def _scene_rect(item) -> QRectF:
    return item.mapRectToScene(item.boundingRect())


def test_eight_gpus_draw_as_bars_with_one_limit_and_legends_outside(
        qtbot, window: MainWindow, voice: Path) -> None:
    window.resize(1400, 900)
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    page.steps.setValue(800)
    _stream(qtbot, page, count=800, ranks=8, gpu=True, rate=2000)
    charts = page.charts
    assert page.store.ranks() == [str(r) for r in range(8)]
    # one figure per GPU: the device's used memory, as a bar each, with its peak
    assert charts.mode == "bars"
    assert list(charts.memory_names().values()) == [
        f"memory/device_used_gib@{r}" for r in range(8)]
    heights = list(charts.bars.opts["height"])
    assert len(heights) == 8 and heights == sorted(heights)  # rank r uses 20 + 5r GiB
    assert len(charts.peaks.data) == 8
    assert not any(n.startswith("memory/") for n in charts.curves)  # no tangle of lines
    # one limit line, at the device's size
    assert charts.limit_line.isVisible() and charts.limit_line.value() == 80.0
    ticks = charts.mem_plot.getAxis("bottom")._tickLevels[0]
    assert [label for _x, label in ticks] == [f"w{r}" for r in range(8)]
    # legends live in their own row: never over a chart's data area
    for plot, legend in ((charts.loss_plot, charts.loss_legend),
                         (charts.mem_plot, charts.mem_legend),
                         (charts.quality_plot, charts.quality_legend)):
        data_area = _scene_rect(plot.getViewBox())
        assert not data_area.intersects(_scene_rect(legend)), plot.titleLabel.text


def test_stat_cards_never_touch_and_progress_shows_eta(qtbot, window: MainWindow,
                                                        voice: Path) -> None:
    window.resize(1100, 760)  # a small window: the cards must still hold their text
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    page.steps.setValue(600)
    _stream(qtbot, page, count=600, ranks=2, rate=600)
    cards = list(page.stats.cards.values())
    for value in ("10.2409", "10.2658", "2.0e-06", "1,006", "0.812", "12.5%"):
        for card in cards:
            card.value.setText(value)
        qtbot.wait(0)
        for card in cards:
            # the text fits its card, and no two cards overlap
            assert card.value.width() >= card.value.sizeHint().width(), (value, card.label.text())
        for i, a in enumerate(cards):
            for b in cards[i + 1:]:
                assert not a.geometry().intersects(b.geometry()), (a.label.text(),
                                                                   b.label.text())
    page.stats.show_progress(340, 1500, 245.0)
    assert page.stats.progress.value() == 340
    assert page.stats.progress.format() == "step 340 of 1500  ·  23%  ·  about 4:05 left"


def test_two_workers_draw_a_line_each_and_one_limit(qtbot, window: MainWindow,
                                                    voice: Path) -> None:
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    page.steps.setValue(400)
    _stream(qtbot, page, count=400, ranks=2, gpu=True, rate=2000)
    mem = sorted(n for n in page.charts.curves if n.startswith("memory/"))
    assert mem == ["memory/device_used_gib@0", "memory/device_used_gib@1"]
    assert page.charts.mode == "lines" and page.charts.limit_line.value() == 80.0


def _write_run(voice: Path, name: str, steps: int, lr: float, total: int) -> Path:
    run = voice / "runs" / name
    run.mkdir(parents=True)
    cfg = TrainConfig()
    cfg.run.steps, cfg.optim.lr, cfg.run.checkpoint_every = steps, lr, 25
    cfg.model.base = "/models/tiny"
    write_json(run / "config.json", cfg.to_dict())
    with (run / "metrics.jsonl").open("w") as fh:
        for s in range(1, 41):
            first = {"perf/build_s": 10.0, "perf/step_s": 3.0} if s == 1 else {}
            fh.write(json.dumps({"kind": "train", "step": s, "rank": 0, "loss/train": 9 - s / 10,
                                 "time": 1.7e9 + 3.0 * s, "total_steps": total, **first})
                     + "\n")
    (run / "checkpoint_step_0000040").mkdir()
    (run / "checkpoint_step_0000040" / "COMPLETE").write_text("")
    return run


def test_a_reloaded_run_keeps_its_step_total_and_loads_its_settings(
        qtbot, window: MainWindow, voice: Path) -> None:
    _write_run(voice, "2026-01-01_a", steps=300, lr=3e-5, total=300)
    _write_run(voice, "2026-01-02_b", steps=120, lr=1e-5, total=120)
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    # the latest run is shown with its total (the engine's run.steps), so the
    # step card reads "40 / 120" instead of losing the total
    qtbot.waitUntil(lambda: page._history is None and page.store.last_step == 40,
                    timeout=10000)
    assert page.stat_labels["step"].text() == "40 / 120"
    # a finished run's time from its metric times (steps 1..40, 3 s apart) and what came
    # before the first (the model's 10 s build, step 1's 3 s), not "—"
    assert page.stat_labels["elapsed"].text() == "2:10"
    assert page.run_picker.count() == 2
    # picking the older run draws it and loads its settings into the form
    index = next(i for i in range(page.run_picker.count())
                 if "2026-01-01_a" in page.run_picker.itemText(i))
    page.run_picker.setCurrentIndex(index)
    page.run_picker.activated.emit(index)
    qtbot.waitUntil(lambda: page._history is None and page.run.total_steps == 300,
                    timeout=10000)
    assert page.steps.value() == 300 and abs(page.lr.value() - 3e-5) < 1e-12
    assert page.ckpt_every.value() == 25 and page.base.currentText() == "/models/tiny"


def test_stop_then_force_and_a_failed_stop_names_the_last_checkpoint(
        qtbot, window: MainWindow, voice: Path) -> None:
    run = _write_run(voice, "2026-01-03_c", steps=100, lr=1e-5, total=100)
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    job = page.start(program=flood_program(0, forever=True, stop_fails=True, run=str(run)))
    qtbot.waitUntil(lambda: page.store.last_step > 10, timeout=30000)
    with qtbot.waitSignal(job.finished, timeout=30000):
        page.stop()
    assert job.outcome == "failed"
    # failed, not "Stopped": the save failed; the log names what is intact
    assert page.state_label.text() == "Failed"
    log = page.log.toPlainText()
    assert "no space left" in log and "checkpoint_step_0000040" in log
    assert page.stop_btn.text() == "Stop" and page.start_btn.isEnabled()

    job = page.start(program=flood_program(0, forever=True, stop_s=600.0))
    qtbot.waitUntil(lambda: page.store.last_step > 10, timeout=30000)
    page.stop()
    assert page.stop_btn.text() == "Force stop" and job.stopping
    with qtbot.waitSignal(job.finished, timeout=30000):
        page.stop()  # the second press kills
    assert job.outcome == "failed" and page.state_label.text() == "Failed"


def test_gpu_probe_parses_devices_and_what_else_holds_them() -> None:
    # the columns of the engine's query (engine.train.gpus.smi_query), the one parser
    gpus = parse_nvidia_smi("0, GPU-aaa, NVIDIA H200, 143771, 120000\n"
                            "1, GPU-bbb, NVIDIA H200, 143771, 143000\nnot a row\n")
    attach_processes(gpus, "GPU-aaa, 4242, /usr/bin/python3, 23000\n"
                           "GPU-zzz, 1, other, 5\nGPU-bbb, 77, x, [N/A]\n")
    assert [g.uuid for g in gpus] == ["GPU-aaa", "GPU-bbb"]
    assert (gpus[0].name, gpus[0].total_mib, gpus[0].free_mib) == ("NVIDIA H200", 143771, 120000)
    assert gpus[0].holders() == "python3 (pid 4242, 22.5 GiB)"
    assert gpus[1].processes == []


EVALUATOR = r'''
import signal, sys, time
from engine.cli.output import JsonOutput
from engine.core.events import Emitter
out = JsonOutput(sys.stdout)
em = Emitter(out.handle)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
em.state("watching", detail=sys.argv[1])
def measured(kind, step, sim, wer, rate):
    values = {"eval/similarity": sim, "eval/wer": wer, "eval/rate_ratio": rate}
    if step is not None:
        values["step"] = step
    em.metric(values, split="eval", label=kind, source_kind=kind, step=step)
measured("zero_shot", None, 0.60, 0.15, 1.0)
measured("checkpoint", 20, 0.55, 0.20, 1.30)
measured("checkpoint", 40, 0.70, 0.10, 1.02)
em.state("evaluation_updated", detail="best: step 40", best_step=40, checkpoints=2)
em.state("early_stop_suggested", best_step=40, detail="no improvement for 2 checkpoints")
# it ends as the engine's watcher does: once the training process it was given has ended
from engine.core.process import alive
pid = int(sys.argv[sys.argv.index("--training-pid") + 1])
while not stop and alive(pid):
    time.sleep(0.05)
out.result({"summary": "Stopped watching."})
'''


def test_evaluation_beside_training_plots_quality_and_stops_early(
        qtbot, window: MainWindow, voice: Path) -> None:
    import sys

    run = _write_run(voice, "2026-01-04_d", steps=100, lr=1e-5, total=100)
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    page.settings.evaluate.setChecked(True)
    page.settings.patience.setValue(2)
    page.settings.style_weight.setValue(0.35)  # the best rule's weight the form shows
    # the engine's `evaluate --watch` speaks this event stream (engine/quality/evaluate.py)
    page.evaluator_program = [sys.executable, "-c", EVALUATOR]
    job = page.start(program=flood_program(0, forever=True, run=str(run), stop_s=0.5))
    assert job is not None
    qtbot.waitUntil(lambda: page.run.evaluator is not None, timeout=30000)
    evaluator = page.run.evaluator
    assert evaluator.args[:5] == ["evaluate", str(voice), "--run", run.name, "--watch"]
    assert evaluator.args[-2:] == ["--patience", "2"]
    at = evaluator.args.index("--style-weight")
    assert evaluator.args[at + 1] == "0.35"
    # no improvement for 2 evaluations: training is stopped (with its checkpoint)
    with qtbot.waitSignal(job.finished, timeout=60000):
        pass
    assert job.outcome == "cancelled"
    # the evaluator has measured the last checkpoint on disk (step 40): it is ended too
    qtbot.waitUntil(lambda: not evaluator.is_running(), timeout=30000)
    sim = page.store.series["quality/similarity"].data()
    assert list(sim[0]) == [20.0, 40.0] and list(sim[1]) == [0.55, 0.70]
    assert list(page.store.series["quality/wer"].data()[1]) == [0.20, 0.10]
    page.redraw()
    charts = page.charts
    assert charts.baseline.isVisible() and charts.baseline.value() == 0.60
    assert all(line.isVisible() and line.value() == 40 for line in charts.best_lines)
    log = page.log.toPlainText()
    assert "Checkpoint 20 sounds less like the speaker than the zero-shot clone" in log
    assert "Checkpoint 20 speaks at 1.30 x" in log
    assert "Early stop: step 40 stays the best checkpoint." in log
    assert page.stat_labels["similarity"].text() == "0.700"


def test_existing_cluster_takes_storage_and_shows_each_node(qtbot, window: MainWindow,
                                                            voice: Path) -> None:
    from engine.train.preflight import NodeReport, PreflightReport

    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    s = page.settings
    assert not s.storage.isEnabled() and not s.preflight_btn.isEnabled()
    s.remote_radio.setChecked(True)
    assert s.storage.isEnabled() and s.preflight_btn.isEnabled()
    s.address.setText("10.0.0.2:6379")
    s.storage.setText("/shared/voxshard runs")
    page.base.setEditText("/models/tiny")
    args = page.train_args()
    assert args[args.index("--storage") + 1] == "/shared/voxshard runs"
    assert s.preflight_args(str(voice)) == [
        "preflight", str(voice), "--base", "/models/tiny", "--address", "10.0.0.2:6379",
        "--storage", "/shared/voxshard runs"]
    # the engine's own report, as `preflight_done` carries it
    report = PreflightReport([
        NodeReport("n1", "node-a", "10.0.0.2", {"python": "3.11.7", "torch": "2.13.0",
                                                "ray": "2.60.0"}, driver_node=True),
        NodeReport("n2", "node-b", "10.0.0.3", {"python": "3.11.7", "torch": "2.12.0",
                                                "ray": "2.60.0"},
                   problems=["torch 2.12.0 here, 2.13.0 on the driver"])],
        "/shared/voxshard runs", "/models/tiny", 1.5).to_dict()
    page.run._on_raw_event({"event": "state", "state": "preflight_done", "report": report})
    items = [s.preflight_list.item(i).text() for i in range(s.preflight_list.count())]
    assert s.preflight_list.isVisibleTo(page) and len(items) == 2
    assert items[0].startswith("✓ node-a (10.0.0.2) — driver")
    assert items[1].startswith("✗ node-b") and "torch 2.12.0 here" in items[1]
    # workers on two nodes are labelled by node and GPU
    for rank, node in ((0, "node-a"), (1, "node-b")):
        page.run._on_raw_event({"event": "state", "state": "worker_node", "rank": rank,
                                "node": node, "gpus": ["0"]})
        page.store.add({"step": 1, "rank": rank, "memory/device_used_gib": 3.0})
    page.redraw()
    assert page.charts.rank_labels == {"0": "node-a GPU 0", "1": "node-b GPU 0"}


def test_every_form_choice_is_a_real_engine_option(qtbot, window: MainWindow,
                                                   voice: Path) -> None:
    """The command lines the form builds parse with the engine's own argument parser."""
    from engine.cli.main import build_parser

    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    s = page.settings
    s.trainable.setCurrentIndex(s.trainable.findData("lora"))
    s.precision.setCurrentIndex(s.precision.findData("fp16"))
    s.act_ckpt.setChecked(True)
    s.offload.setChecked(True)
    s.remote_radio.setChecked(True)
    s.address.setText("10.0.0.2:6379")
    s.storage.setText("/shared/runs")
    parser = build_parser()
    train = parser.parse_args(page.train_args(resume=True))
    assert (train.trainable, train.precision, train.storage) == ("lora", "fp16", "/shared/runs")
    assert train.activation_checkpointing and train.cpu_offload and train.resume
    plan = parser.parse_args(["plan", *page.common_args()])
    assert plan.trainable == "lora" and plan.address == "10.0.0.2:6379"
    parser.parse_args(s.preflight_args(str(voice)))
    s.evaluate.setChecked(True)
    s.patience.setValue(3)
    assert not s.style_weight.isEnabled() or s.evaluate.isChecked()
    s.style_weight.setValue(0.5)
    watch = parser.parse_args(s.evaluate_args(str(voice), "run-1", training_pid=4242))
    assert watch.watch and watch.patience == 3 and watch.style_weight == 0.5
    assert watch.training_pid == 4242
