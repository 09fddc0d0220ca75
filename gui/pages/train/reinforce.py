"""The Train page's Reinforce step (issue 33): GRPO after a run, rewarded by the clone's
own scores, started as `voxshard-engine reinforce` through an `EngineJob` like training.

The panel acts on the run picked on the page. Live, per iteration: the reward, each of
its terms, the KL to the starting checkpoint and the groups' reward spread (the engine's
`metric` events of split "reinforce"); at rest, the same figures read back from the
run's metrics.jsonl (rows of kind "reinforce"). Stop asks the engine to finish and save
the iteration under way; Resume continues from the stage's own checkpoint. The stage's
checkpoints are the run's, so the page's evaluation and best pick include them.

Where it runs, as training's settings choose it: in the engine's process (0 workers), or
with the policy update in N Ray Train workers (`--workers`) on a private local cluster or
an existing one (`--address`). What the engine refuses there (a LoRA run, renders that do
not split evenly over the workers, a cluster it cannot reach) it says in one sentence, shown
on the state line.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QLabel,
    QLineEdit,
    QScrollArea,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine.config.reinforce import ReinforceConfig
from engine.config.schema import flag_of
from engine.core.atomic import read_json
from engine.layout.checkpoints import REINFORCE_STAGE, checkpoint_stage, step_of
from engine.layout.run import Run
from gui.jobs import EngineJob
from gui.metrics import MetricsStore
from gui.settings_form import SettingField
from gui.theme import SERIES
from gui.widgets import SciSpinBox, button, hbox

#: what the stage logs per iteration (engine.reinforce.session), under "reinforce/"
REWARD_KEYS = {"reward": ("reward", SERIES[0]), "similarity": ("similarity", SERIES[3]),
               "wer": ("word errors", SERIES[5 % len(SERIES)]),
               "capped": ("hit the cap", SERIES[2]), "rate_off": ("rate off", SERIES[4]),
               # the share of renders the runaway guard cut (also counted in "capped")
               "runaway": ("cut short", SERIES[1])}
#: the settings the form shows beside Iterations (the rest of ReinforceConfig)
OTHER_FIELDS = [f.name for f in dataclasses.fields(ReinforceConfig) if f.name != "iterations"]
#: the settings shown only for a run trained with styles (they change nothing for another)
STYLE_FIELDS = ("style_weight", "style_share")


def _lr_box() -> SciSpinBox:
    """The stage's learning rate, in scientific notation (its arrows halve or double it)."""
    box = SciSpinBox()
    box.setRange(1e-10, 1e-2)
    return box


def stage_steps(run_dir: Path | None) -> list[int]:
    """The steps of the run's checkpoints the reinforce stage wrote, oldest first."""
    if run_dir is None:
        return []
    return [step_of(c) or 0 for c in Run(run_dir).checkpoints()
            if checkpoint_stage(c) == REINFORCE_STAGE]


def stage_history(run_dir: Path) -> list[dict[str, Any]]:
    """The stage's rows of the run's metrics.jsonl, one per iteration (a resumed stage
    repeats the iterations after its last checkpoint: the later row counts)."""
    rows = {int(r["iteration"]): r for r in Run(run_dir).metrics()
            if r.get("kind") == "reinforce" and isinstance(r.get("iteration"), int)}
    return [rows[i] for i in sorted(rows)]


def stage_iterations(run_dir: Path) -> int | None:
    """The iterations the run's last stage was asked for (its report's settings), or None:
    no stage reported yet."""
    report = read_json(Run(run_dir).reinforce_report)
    asked = ((report or {}).get("config") or {}).get("iterations") \
        if isinstance(report, dict) else None
    return asked if isinstance(asked, int) and asked > 0 else None


def start_words(run_dir: Path, name: str) -> str:
    """The checkpoint a new stage starts from, as the engine chooses it (Run.reinforce_start)."""
    found = Run(run_dir).reinforce_start()
    if found is None:
        return f"The run {name} has no training checkpoint to reinforce."
    start, best = found
    # one line at 1100x760 (the run's name is the picker's, above the tabs)
    if best:
        return f"Starts from step {step_of(start)}, the evaluation's best."
    return f"Starts from step {step_of(start)}, the newest checkpoint: no evaluation yet."


class ReinforceCharts(pg.GraphicsLayoutWidget):
    """Reward and its terms (left, its legend in a row of its own under it), the KL and
    the groups' reward spread (stacked right, one iteration axis under both), per
    iteration. Every range comes from the data: a reward of -1.5 is in view, not cut off
    by a fixed 0-1 axis."""

    def __init__(self, store: MetricsStore) -> None:
        super().__init__()
        self.store = store
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.reward_plot = self._plot("Reward and its terms", 0, 0, rowspan=2)
        self.kl_plot = self._plot("KL to the start", 0, 1)
        # the legend is the reward's (under it): the right column takes its row too
        self.spread_plot = self._plot("Spread in a group", 1, 1, rowspan=2)
        # the KL's iterations are the spread's: at 1100x760 the KL's own tick labels ran
        # into the spread's title
        self.kl_plot.hideAxis("bottom")
        self.kl_plot.setXLink(self.spread_plot)
        self.plots = (self.reward_plot, self.kl_plot, self.spread_plot)
        # two a row, under the reward only: three made the left column wider than its
        # share at 1100x760, and the right one was cut off
        self.legend = pg.LegendItem(colCount=2, labelTextSize="8pt", verSpacing=-6)
        self.legend.setMaximumHeight(58)
        self.addItem(self.legend, row=2, col=0)
        for key, (label, color) in REWARD_KEYS.items():
            self._line(self.reward_plot, f"reinforce/{key}", color, label)
        self._line(self.kl_plot, "reinforce/kl", SERIES[1])
        self._line(self.spread_plot, "reinforce/reward_spread", SERIES[0])
        layout = self.ci.layout
        layout.setContentsMargins(2, 2, 2, 2)  # the height is short at 1100x760
        for row, stretch in enumerate((1, 1, 0)):
            layout.setRowStretchFactor(row, stretch)
        layout.setColumnStretchFactor(0, 3)
        layout.setColumnStretchFactor(1, 2)
        # what the tab has left at 1100x760 with the plan's note shown (120-150 px): a
        # larger minimum pushed the spread chart out of view and the lowest reward
        # onto the edge
        self.setMinimumHeight(120)

    def _plot(self, title: str, row: int, col: int, rowspan: int = 1) -> pg.PlotItem:
        p = self.addPlot(row=row, col=col, rowspan=rowspan)
        # a title's width is its plot's minimum: at the default size the three were
        # wider than the tab at 1100x760, and the right column was cut off; the titles
        # say what the axes hold, so the axes carry no names (the smallest window's width;
        # the iterations axis's name cost the reward chart 18 px of the tab's height)
        p.setTitle(title, size="9pt")
        left = p.getAxis("left")
        left.enableAutoSIPrefix(False)
        # small tick text, major ticks only: at 1100x760 a chart is ~70 px tall, and
        # pyqtgraph drops every label that would overlap the next
        small = QFont()
        small.setPointSize(8)
        for axis in (left, p.getAxis("bottom")):
            axis.setStyle(tickFont=small, maxTickLevel=0, maxTextLevel=0)
        left.setWidth(46)  # room for "0.0006": a narrower axis dropped the KL's labels
        p.disableAutoRange()  # ranges are set from the data in redraw()
        return p

    def _line(self, plot: pg.PlotItem, name: str, color: str, label: str = "") -> None:
        # symbols: a stage of a few iterations is a few points, each worth seeing
        curve = pg.PlotDataItem(pen=pg.mkPen(QColor(color), width=1), symbol="o",
                                symbolSize=5, symbolBrush=QColor(color))
        plot.addItem(curve)
        if label:  # the KL and the spread: their chart's title says what the line is
            self.legend.addItem(curve, label)
        self.curves[name] = curve

    def _data(self, plot: pg.PlotItem) -> tuple[np.ndarray, np.ndarray]:
        """Every point the plot's lines draw (x, y), NaNs left out."""
        xs, ys = [], []
        for name, curve in self.curves.items():
            series = self.store.series.get(name)
            if series is None or curve.getViewBox() is not plot.getViewBox():
                continue
            x, y = series.data()
            keep = np.isfinite(y)
            xs.append(np.asarray(x)[keep])
            ys.append(np.asarray(y)[keep])
        if not xs:
            return np.zeros(0), np.zeros(0)
        return np.concatenate(xs), np.concatenate(ys)

    def redraw(self) -> None:
        for name, curve in self.curves.items():
            series = self.store.series.get(name)
            curve.setData(*series.data()) if series is not None else curve.setData([], [])
        for plot in self.plots:
            x, y = self._data(plot)
            if not len(x):
                plot.setXRange(0.5, 1.5, padding=0)
                plot.setYRange(0.0, 1.0, padding=0)
                continue
            # one iteration is a point in the middle, not on the edge
            plot.setXRange(float(x.min()) - 0.5, float(x.max()) + 0.5, padding=0)
            lo, hi = float(y.min()), float(y.max())
            if plot is not self.reward_plot:
                # the KL and the spread are >= 0: from zero, so a flat line reads as its
                # level, not as noise
                lo = min(lo, 0.0)
            span = hi - lo if hi > lo else max(abs(hi), 1e-3)
            plot.setYRange(lo - (0.08 * span if plot is self.reward_plot else 0.0),
                           hi + 0.12 * span, padding=0)

    def points(self, name: str) -> int:
        """How many points the chart of `name` draws (tests, the page's words)."""
        x, _y = self.curves[name].getData()
        return 0 if x is None else len(x)


class ReinforcePanel(QWidget):
    """The Reinforce tab: settings, Reinforce / Resume / Stop, state words, charts."""

    #: the stage ended (outcome: "succeeded" | "cancelled" | "failed"); the page re-reads
    #: the run (its checkpoints, its evaluation)
    ended = Signal(str)
    log = Signal(str, str)  # level, message: the page's log

    def __init__(self, page: Any) -> None:
        super().__init__()
        self.page = page  # the TrainPage: its voice, the run picked, start_job
        self.job: EngineJob | None = None
        self.total = 0
        self.extra_args: list[str] = []  # tests: a recogniser that needs no download
        self.store = MetricsStore()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        # Settings sits on the state's line: with it, the buttons' row was wider than the tab
        # at the smallest window and the spin box's text was cut
        lay.addWidget(self._build_buttons())
        self.form = self._build_form()
        self.state = QLabel("")
        self.state.setWordWrap(True)
        self.note = QLabel("")  # what the run holds of the stage, or why it cannot start
        self.note.setObjectName("Muted")
        self.note.setWordWrap(True)
        lay.addWidget(hbox(self.state, self.more_btn))
        lay.addWidget(self.note)
        self.charts = ReinforceCharts(self.store)
        lay.addWidget(self.charts, 1)
        # open, the settings take the charts' place: at 1100x760 the tab cannot hold both
        # readably (a box of two rows over 40 px charts)
        lay.addWidget(self.form, 1)
        self.start_btn.clicked.connect(lambda: self.start())
        self.resume_btn.clicked.connect(lambda: self.start(resume=True))
        self.stop_btn.clicked.connect(self.stop)
        self.update_buttons()

    # -- sections -------------------------------------------------------------------
    def _build_buttons(self) -> QWidget:
        """Iterations (its own words after the number: the row has no room for a label)
        and the stage's buttons."""
        self.iterations_field = SettingField(ReinforceConfig, "iterations")
        self.iterations = self.iterations_field.widget
        self.iterations.setSuffix(f" {self.iterations_field.label.lower()}")
        self.start_btn = button("Reinforce", primary=True,
                                tip="Reinforce the run picked above from its best checkpoint "
                                    "(or its newest, before an evaluation)")
        self.resume_btn = button("Resume",
                                 tip="Continue the run's reinforce stage from its own checkpoint")
        self.stop_btn = button("Stop", tip="Finishes and saves the iteration under way, "
                                           "then stops")
        self.more_btn = QToolButton()
        self.more_btn.setText("Settings")
        self.more_btn.setCheckable(True)
        self.more_btn.setToolTip("The stage's other settings (voice.toml [reinforce]), in "
                                 "the charts' place; press again for the charts")
        self.more_btn.toggled.connect(self._show_settings)
        return hbox(self.iterations, self.start_btn, self.resume_btn, self.stop_btn)

    def _build_form(self) -> QScrollArea:
        """The stage's other settings, each made from its config field (label, unit, bounds,
        help), then where it runs; a bounded box that scrolls, shown in the charts' place."""
        inner = QWidget()
        grid = QGridLayout(inner)
        grid.setContentsMargins(0, 0, 0, 0)
        #: the form's settings by field name (the learning rate in scientific notation)
        self.fields = {name: SettingField(ReinforceConfig, name, widget=_lr_box()
                                          if name == "lr" else None)
                       for name in OTHER_FIELDS}
        self.labels: dict[str, QLabel] = {}
        for i, (name, field) in enumerate(self.fields.items()):
            label = QLabel(field.label)
            label.setToolTip(field.widget.toolTip())
            self.labels[name] = label
            # one column: with their units, two columns were wider than the tab at 1100x760
            grid.addWidget(label, i, 0)
            grid.addWidget(field.widget, i, 1)
        self._build_cluster(grid, len(OTHER_FIELDS))
        form = QScrollArea()
        form.setWidget(inner)
        form.setWidgetResizable(True)
        form.setFrameShape(QFrame.Shape.NoFrame)
        form.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        form.hide()
        return form

    def _build_cluster(self, grid: QGridLayout, row: int) -> None:
        """Where the stage runs (the engine's --workers / --address, as training's)."""
        self.workers = QSpinBox()
        self.workers.setRange(0, 64)
        self.workers.setSpecialValueText("this process")
        self.workers.setToolTip("Ray Train workers for the policy update (FSDP2, as "
                                "training); 'this process': the stage runs in the engine's "
                                "own process")
        self.address = QLineEdit()
        # short: the form's column is narrow at a laptop's size (the tooltip says the rest)
        self.address.setPlaceholderText("host:port")
        self.address.setToolTip("With workers: an existing Ray cluster to run on; empty, "
                                "the engine starts a private one on this machine")
        self.address.setEnabled(False)
        self.workers.valueChanged.connect(lambda n: self.address.setEnabled(n > 0))
        for i, (text, widget) in enumerate((("Ray workers", self.workers),
                                            ("Cluster", self.address))):
            grid.addWidget(QLabel(text), row + i, 0)
            grid.addWidget(widget, row + i, 1)

    # -- settings -------------------------------------------------------------------
    def _show_settings(self, on: bool) -> None:
        self.charts.setVisible(not on)
        self.form.setVisible(on)
        self.more_btn.setText("Charts" if on else "Settings")

    def load_voice_settings(self, cfg: ReinforceConfig) -> None:
        """The voice's [reinforce] values in the form (a flag is sent only when changed)."""
        self._voice_cfg = cfg
        self.iterations.setValue(int(cfg.iterations))
        for name, field in self.fields.items():
            field.set_value(getattr(cfg, name))

    def settings_args(self) -> list[str]:
        """The flags of the form's settings that differ from the voice's; ValueError with
        one sentence for a value the stage would refuse."""
        base: ReinforceConfig = getattr(self, "_voice_cfg", ReinforceConfig())
        given = {"iterations": self.iterations.value(),
                 **{name: field.value() for name, field in self.fields.items()}}
        try:
            cfg = base.replace(**given)
        except ValueError as exc:
            raise ValueError(f"Invalid reinforce setting: {exc}.") from None
        args: list[str] = []
        for name in ("iterations", *OTHER_FIELDS):
            if getattr(cfg, name) != getattr(base, name) or name == "iterations":
                args += [flag_of(ReinforceConfig, name), str(getattr(cfg, name))]
        return args + self.cluster_args()

    def cluster_args(self) -> list[str]:
        """Where the stage runs: nothing (the engine's process), or its Ray workers and
        the cluster's address when one is given."""
        workers = self.workers.value()
        if not workers:
            return []
        address = self.address.text().strip()
        return ["--workers", str(workers), *(["--address", address] if address else [])]

    # -- state ------------------------------------------------------------------------
    def run_dir(self) -> Path | None:
        run = self.page.selected_run()
        return run.path if run is not None else None

    def update_buttons(self) -> None:
        running = self.job is not None
        busy = running or getattr(self.page.run, "job", None) is not None
        run = self.page.selected_run() if self.page.voice is not None else None
        trained = bool(run is not None and [
            c for c in run.checkpoints if checkpoint_stage(c) != REINFORCE_STAGE])
        own = stage_steps(run.path) if run is not None else []
        self.start_btn.setEnabled(not busy and trained)
        self.resume_btn.setEnabled(not busy and bool(own))
        self.stop_btn.setEnabled(running)
        self.iterations.setEnabled(not running)
        self.form.setEnabled(not running)
        if running:
            return
        if run is None:
            self.note.setText("Train a run first: the stage starts from one of its checkpoints.")
        elif not trained:
            self.note.setText(f"The run {run.name} has no checkpoint yet, so there is nothing "
                              "to reinforce: train it (or resume it) first.")
        elif own:
            which = f"step {own[0]}" if len(own) == 1 else \
                f"steps {', '.join(map(str, own[:-1]))} and {own[-1]}"
            self.note.setText(f"The reinforce stage added {which} to {run.name}: Evaluate "
                              "measures them beside training's, and the best pick chooses "
                              "across both.")
        else:
            self.note.setText(start_words(run.path, run.name))

    def show_run(self, run_dir: Path | None) -> None:
        """The picked run's stage so far, read from its folder."""
        self.store.clear()
        styled = run_dir is not None and bool(Run(run_dir).trained_styles())
        for name in STYLE_FIELDS:
            self.fields[name].widget.setVisible(styled)
            self.labels[name].setVisible(styled)
        rows = stage_history(run_dir) if run_dir is not None else []
        for row in rows:
            self._add(row)
        self.charts.redraw()
        if self.job is None:
            # a run's stage: the iterations it was asked for (Resume goes on to them), not
            # the voice's default again after a restart
            asked = stage_iterations(run_dir) if run_dir is not None else None
            voice_cfg: ReinforceConfig = getattr(self, "_voice_cfg", ReinforceConfig())
            self.iterations.setValue(asked or int(voice_cfg.iterations))
            self.state.setText(f"Reinforced: {len(rows)} iteration(s) so far." if rows
                               else "Not reinforced yet.")
        self.update_buttons()

    def _add(self, values: dict[str, Any]) -> None:
        it = values.get("iteration")
        if isinstance(it, int | float):
            self.store.add({"step": it, **{k: v for k, v in values.items()
                                           if k.startswith("reinforce/")}})

    # -- the job ------------------------------------------------------------------------
    def start(self, resume: bool = False) -> EngineJob | None:
        voice, run = self.page.voice, self.page.selected_run()
        if voice is None or run is None or self.job is not None or self.page.run.job is not None:
            return None
        if not run.checkpoints:
            self.state.setText(f"The run {run.name} has no checkpoint to reinforce: train it "
                               "first.")
            return None
        try:
            args = self.settings_args()
        except ValueError as exc:
            self.state.setText(str(exc))
            return None
        args = ["reinforce", str(voice), "--run", run.name, *args,
                *(["--resume"] if resume else []), *self.extra_args]
        self.total = self.iterations.value()
        job = self.page.start_job(args, "Reinforce", voice=voice)
        self.job = job
        self.show_run(run.path if resume else None)
        job.metric.connect(self._on_metric)
        job.state.connect(self._on_state)
        job.succeeded.connect(lambda r: self._end("succeeded", str(r.get("summary") or "")))
        job.cancelled.connect(lambda: self._end("cancelled", job.error[1] if job.error
                                                else "Stopped."))
        job.failed.connect(lambda _c, m, h: self._end("failed", m))
        job.finished.connect(self._finished)
        self.state.setText("Resuming the reinforce stage…" if resume
                           else "Starting the reinforce stage…")
        self.log.emit("info", f"Reinforce {'resumed' if resume else 'started'} on {run.name}: "
                              f"{self.total} iterations.")
        self.update_buttons()
        self.page.refresh()
        return job

    def stop(self) -> None:
        if self.job is None:
            return
        if self.job.stopping:
            self.job.force_stop()
            return
        self.job.cancel()
        self.state.setText("Stopping: finishing and saving the iteration under way…")
        self.stop_btn.setText("Force stop")

    def _on_metric(self, values: dict) -> None:
        if not any(str(k).startswith("reinforce/") for k in values):
            return
        self._add(values)
        self.charts.redraw()
        if self.job is not None and not self.job.stopping:
            self.state.setText(f"Reinforcing, iteration {int(values['iteration'])} of "
                               f"{self.total}")

    def _on_state(self, state: str, detail: str) -> None:
        if self.job is None or self.job.stopping:
            return
        words = {"loading": "Loading", "reinforcing": "Reinforcing"}.get(
            state, state.replace("_", " ").capitalize())
        self.state.setText(f"{words}: {detail}" if detail else words)

    def _end(self, outcome: str, words: str) -> None:
        if outcome == "succeeded":
            text = words.splitlines()[0] if words else "Reinforce finished."
        elif outcome == "cancelled":
            text = words or "Stopped."
        else:
            text = "Reinforce did not run: " + words if not self.store.series else words
        self.state.setText(text)
        self.log.emit("error" if outcome == "failed" else "info", words or text)

    def _finished(self) -> None:
        outcome = self.job.outcome if self.job is not None else "failed"
        self.job = None
        self.stop_btn.setText("Stop")
        self.update_buttons()
        self.ended.emit(str(outcome))
