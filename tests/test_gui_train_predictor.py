"""The Train page's side of issue 32: the code predictor's share of frames as a setting that
reaches the engine's own parser and comes back from a run's config, and each group's
update/weight ratio drawn beside the learning rate."""

from __future__ import annotations

from pathlib import Path

from engine.cli.main import build_parser
from engine.config.train import TrainConfig
from gui.app import MainWindow
from gui.metrics import MetricsStore
from gui.pages.train import TrainPage
from gui.pages.train.charts import TrainCharts


def test_predictor_frames_reach_the_engine_and_come_back_from_a_run(
        qtbot, window: MainWindow, voice: Path) -> None:
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    s = page.settings
    assert s.predictor_frames.value() == 1.0 and s.predictor_frames.toolTip()
    page.base.setEditText("/models/tiny")
    parser = build_parser()
    # the default adds no flag: the engine's default (or the voice's own) decides
    assert "--predictor-frames" not in page.train_args()
    s.predictor_frames.setValue(0.25)
    assert parser.parse_args(page.train_args()).predictor_frames == 0.25
    assert parser.parse_args(["plan", *page.common_args()]).predictor_frames == 0.25
    cfg = TrainConfig()
    cfg.model.base, cfg.model.predictor_frames = "/models/tiny", 0.125
    s.load_run_config(cfg.to_dict())
    assert s.predictor_frames.value() == 0.125


def test_update_ratios_are_drawn_beside_the_learning_rate(qtbot) -> None:
    store = MetricsStore()
    charts = TrainCharts(store)
    qtbot.addWidget(charts)
    for step in (1, 2, 3):
        store.add({"step": step, "lr": 1e-4 * step, "update/talker": 2e-4 * step,
                   "update/code_predictor": 3e-4 * step})
    charts.redraw()
    assert charts.plot_for("update/talker") is charts.update_plot
    assert charts.update_plot.scene() is charts.lr_plot.scene()  # the same tab
    for key, top in (("update/talker", 6e-4), ("update/code_predictor", 9e-4)):
        xs, ys = charts.curves[key].getData()
        assert list(xs) == [1.0, 2.0, 3.0] and abs(ys[-1] - top) < 1e-12
