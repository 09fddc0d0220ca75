"""Train: choose the base model, hardware and settings; watch the run live.

Metric events only append to bounded series (gui/metrics.py); the charts are
redrawn by a timer (one chart per tick), and only when something changed, so
a run of 100k steps draws as fast as one of 100.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TextIO

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QProcess, Qt, QTimer
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QProgressBar,
    QRadioButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from .. import voicedata
from ..context import AppContext
from ..jobs import EngineJob
from ..metrics import MetricsStore
from ..theme import SERIES
from ..widgets import button, fmt_duration, hbox
from .base import Page

HISTORY_LINES_PER_SLICE = 2000
# memory series drawn per worker (engine/train/metrics.py memory_values), plus a
# device limit when the engine sends one (`memory/limit_gib`, `memory/total_gib`)
MEMORY_CURVES = ("allocated_gib", "reserved_gib", "peak_gib", "rss_gib")
BASE_MODELS = ["Qwen/Qwen3-TTS-12Hz-1.7B-Base", "Qwen/Qwen3-TTS-12Hz-0.6B-Base"]

STATE_LABELS = {
    "starting_cluster": "Starting the Ray cluster",
    "loading_model": "Loading the base model",
    "extracting_codes": "Extracting codec codes",
    "sharding": "Sharding the model (FSDP2)",
    "training": "Training",
    "validating": "Validating",
    "checkpointing": "Saving a checkpoint",
    "recovering": "Recovering from a failed worker",
    "checkpoint": "Training (checkpoint saved)",
    "restarting": "Recovering from a failed worker",
    "worker_started": "Worker started",
    "x_vector": "Computing the speaker embedding",
    "preparing": "Preparing",
    "stopping": "Stopping: saving a checkpoint",
    "finished": "Finished",
    "done": "Finished",
    "cancelled": "Stopped",
}


@dataclass(frozen=True)
class Preset:
    name: str
    max_minutes: float
    steps: int
    lr: float
    note: str


PRESETS = [
    Preset("Few minutes of audio", 5, 400, 2e-6,
           "short run, low learning rate to avoid overfitting"),
    Preset("Standard (5–30 min)", 30, 1500, 2e-6, "the usual fine-tune"),
    Preset("Large (over 30 min)", 1e9, 4000, 2e-6, "more steps for more data"),
]


def preset_for(minutes: float | None) -> Preset:
    for p in PRESETS:
        if minutes is None or minutes < p.max_minutes:
            return p
    return PRESETS[-1]


@dataclass
class Gpu:
    index: int
    name: str
    total_mib: float
    free_mib: float


def parse_nvidia_smi(text: str) -> list[Gpu]:
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        try:
            gpus.append(Gpu(int(parts[0]), parts[1], float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    return gpus


class TrainPage(Page):
    title = "Train"
    subtitle = ("Fine-tune Qwen3-TTS on this voice: one worker per GPU, sharded with FSDP2 "
                "on a Ray cluster. Stop saves a checkpoint; resume continues from it.")
    icon_name = "train"
    REDRAW_MS = 125

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.job: EngineJob | None = None
        self.export_job: EngineJob | None = None
        self.download_job: EngineJob | None = None
        self.store = MetricsStore()
        self.gpus: list[Gpu] = []
        self._versions: dict[str, int] = {}
        self._curves: dict[str, pg.PlotDataItem] = {}
        self._limit_lines: dict[str, pg.InfiniteLine] = {}
        self._t0: float | None = None
        self._train_t0: tuple[float, float] | None = None  # (time, step) at first step
        self.total_steps = 0
        self.redraws = 0
        self.redraw_ticks = 0  # turns of the redraw timer; redraws never outnumber them + 1
        self._final_ticks = 0
        self._ranged: dict[int, bool] = {}
        self._shown_voice: object = None
        self._starts: dict[str, int] = {}  # worker starts per rank: >1 means a recovery
        self.worker_pids: dict[str, int] = {}  # rank -> pid of its current Ray worker
        self._history: TextIO | None = None

        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self._build_settings())
        split.addWidget(self._build_monitor())
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setSizes([380, 900])
        self.outer.addWidget(split, 1)

        self.redraw_timer = QTimer(self)
        self.redraw_timer.setInterval(self.REDRAW_MS)
        self.redraw_timer.timeout.connect(self._tick)
        self._turn = 0
        self._detect_gpus()

    # -- settings column -----------------------------------------------------------
    def _build_settings(self) -> QWidget:
        col = QWidget()
        lay = QVBoxLayout(col)
        lay.setContentsMargins(0, 0, 8, 0)

        model_box = QGroupBox("Base model")
        mf = QVBoxLayout(model_box)
        self.base = QComboBox()
        self.base.setEditable(True)
        self.base.addItems(BASE_MODELS)
        self.base.setToolTip("A Hugging Face hub id or a local model folder.")
        mf.addWidget(self.base)
        self.download_btn = button("Download", "import", slot=lambda: self.download(),
                                   tip="Fetch the hub model into the local cache "
                                       "(resumes an interrupted download)")
        mf.addWidget(hbox(button("Local folder…", "folder", slot=self._browse_base),
                          self.download_btn))
        self.download_bar = QProgressBar()
        self.download_bar.hide()
        self.model_note = QLabel("")
        self.model_note.setObjectName("Muted")
        self.model_note.setWordWrap(True)
        mf.addWidget(self.download_bar)
        mf.addWidget(self.model_note)
        lay.addWidget(model_box)

        hw_box = QGroupBox("Hardware")
        hf = QVBoxLayout(hw_box)
        self.gpu_list = QListWidget()
        self.gpu_list.setMaximumHeight(96)
        self.gpu_note = QLabel("Looking for GPUs…")
        self.gpu_note.setObjectName("Muted")
        self.gpu_note.setWordWrap(True)
        self.workers = QSpinBox()
        self.workers.setRange(1, 64)
        self.workers.setValue(2)
        hf.addWidget(self.gpu_list)
        hf.addWidget(self.gpu_note)
        hf.addWidget(hbox(QLabel("Workers"), self.workers, stretch_at=2))
        lay.addWidget(hw_box)

        set_box = QGroupBox("Settings")
        sf = QFormLayout(set_box)
        self.preset = QComboBox()
        for p in PRESETS:
            self.preset.addItem(p.name)
        self.preset.currentIndexChanged.connect(self._apply_preset)
        self.preset_note = QLabel()
        self.preset_note.setObjectName("Muted")
        self.preset_note.setWordWrap(True)
        self.steps = QSpinBox()
        self.steps.setRange(1, 10_000_000)
        self.steps.setSingleStep(100)
        self.lr = QDoubleSpinBox()
        self.lr.setDecimals(8)
        self.lr.setRange(1e-8, 1e-2)
        self.lr.setSingleStep(1e-6)
        sf.addRow("Preset", self.preset)
        sf.addRow(self.preset_note)
        self.ckpt_every = QSpinBox()
        self.ckpt_every.setRange(1, 1_000_000)
        self.ckpt_every.setToolTip("A checkpoint every N steps; Stop also saves one")
        sf.addRow("Steps", self.steps)
        sf.addRow("Learning rate", self.lr)
        sf.addRow("Checkpoint every", self.ckpt_every)
        lay.addWidget(set_box)

        cl_box = QGroupBox("Cluster")
        cf = QVBoxLayout(cl_box)
        self.local_radio = QRadioButton("Local (this machine, loopback only)")
        self.remote_radio = QRadioButton("Existing Ray cluster")
        self.local_radio.setChecked(True)
        group = QButtonGroup(cl_box)
        group.addButton(self.local_radio)
        group.addButton(self.remote_radio)
        self.address = QLineEdit()
        self.address.setPlaceholderText("ray://host:10001 or host:6379")
        self.address.setEnabled(False)
        self.remote_radio.toggled.connect(self.address.setEnabled)
        cf.addWidget(self.local_radio)
        cf.addWidget(self.remote_radio)
        cf.addWidget(self.address)
        lay.addWidget(cl_box)

        self.plan_btn = button("Check memory plan", "info", slot=self.plan)
        self.start_btn = button("Start training", "play", primary=True, slot=lambda: self.start())
        self.resume_btn = button("Resume", "resume", slot=lambda: self.start(resume=True))
        self.stop_btn = button("Stop", "stop", danger=True, slot=self.stop)
        self.stop_btn.setEnabled(False)
        self.export_btn = button("Export model", "save", slot=lambda: self.export(),
                                 tip="Write the latest checkpoint as a model folder that "
                                     "the official loader and Listen can use")
        lay.addWidget(self.plan_btn)
        lay.addWidget(hbox(self.start_btn, self.resume_btn, self.stop_btn))
        lay.addWidget(self.export_btn)
        lay.addStretch(1)
        self._apply_preset(0)

        scroll = QScrollArea()
        scroll.setWidget(col)
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(370)
        return scroll

    def _browse_base(self) -> None:
        dlg = QFileDialog(self, "Choose a Qwen3-TTS model folder")
        dlg.setFileMode(QFileDialog.FileMode.Directory)
        dlg.fileSelected.connect(self.base.setEditText)
        dlg.open()

    def _apply_preset(self, index: int) -> None:
        p = PRESETS[max(0, index)]
        self.steps.setValue(p.steps)
        self.lr.setValue(p.lr)
        self.ckpt_every.setValue(max(1, p.steps // 4))
        self.preset_note.setText(p.note)

    def _detect_gpus(self) -> None:
        # nvidia-smi, asynchronously: the GUI never loads torch to ask CUDA
        self._smi = QProcess(self)
        self._smi.finished.connect(self._gpus_found)
        self._smi.errorOccurred.connect(lambda _e: self._gpus_found(-1, None))
        self._smi.start("nvidia-smi", ["--query-gpu=index,name,memory.total,memory.free",
                                       "--format=csv,noheader,nounits"])

    def _gpus_found(self, code: int, _status: object) -> None:
        if self._smi is None:
            return
        out = bytes(self._smi.readAllStandardOutput().data()).decode() if code == 0 else ""
        self._smi.deleteLater()
        self._smi = None
        self.gpus = parse_nvidia_smi(out)
        self.gpu_list.clear()
        for g in self.gpus:
            item = QListWidgetItem(f"GPU {g.index}: {g.name} — {g.free_mib / 1024:.1f} of "
                                   f"{g.total_mib / 1024:.1f} GiB free")
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked)
            self.gpu_list.addItem(item)
        if self.gpus:
            self.gpu_note.setText("One training worker per checked GPU.")
            self.workers.setValue(len(self.gpus))
            self.workers.setEnabled(False)
            self.gpu_list.itemChanged.connect(self._gpu_selection_changed)
        else:
            self.gpu_list.hide()
            self.gpu_note.setText("No NVIDIA GPU found: training runs on CPU workers "
                                  "(slow; fine for the tiny test model).")

    def _gpu_selection_changed(self, _item: QListWidgetItem) -> None:
        self.workers.setValue(max(1, len(self.selected_gpus())))

    def selected_gpus(self) -> list[int]:
        out = []
        for i in range(self.gpu_list.count()):
            item = self.gpu_list.item(i)
            if item.checkState() == Qt.CheckState.Checked:
                out.append(self.gpus[i].index)
        return out

    # -- monitor column -----------------------------------------------------------
    def _build_monitor(self) -> QWidget:
        mon = QWidget()
        lay = QVBoxLayout(mon)
        lay.setContentsMargins(8, 0, 0, 0)
        stats = QGridLayout()
        stats.setHorizontalSpacing(18)
        self.state_label = QLabel("Idle")
        self.state_label.setObjectName("StateLabel")
        self.stat_labels: dict[str, QLabel] = {}
        for col, (key, caption) in enumerate([("step", "step"), ("loss", "train loss"),
                                              ("val", "val loss"), ("lr", "learning rate"),
                                              ("tps", "tokens/s"), ("elapsed", "elapsed"),
                                              ("eta", "ETA")]):
            value = QLabel("—")
            value.setObjectName("StatValue")
            # fixed width: a value growing a digit must not re-layout (and so
            # repaint from scratch) the charts below
            value.setFixedWidth(160 if key in ("step", "lr") else 128)
            cap = QLabel(caption)
            cap.setObjectName("StatLabel")
            stats.addWidget(value, 0, col)
            stats.addWidget(cap, 1, col)
            self.stat_labels[key] = value
        lay.addWidget(hbox(QLabel("<b>State</b>"), self.state_label, stretch_at=2))
        stats.setColumnStretch(7, 1)
        lay.addLayout(stats)

        self.charts = pg.GraphicsLayoutWidget()
        self.charts.setMinimumHeight(380)
        self.loss_plot = self._plot("Loss", "loss", row=0, col=0)
        self.mem_plot = self._plot("Memory per worker", "GiB", row=0, col=1)
        self.lr_plot = self._plot("Learning rate", "lr", row=1, col=0)
        self.tps_plot = self._plot("Throughput", "tokens/s", row=1, col=1)
        for p in (self.loss_plot, self.mem_plot, self.lr_plot, self.tps_plot):
            p.addLegend(offset=(-8, 8), labelTextSize="8pt")
        self._curve(self.loss_plot, "loss/train", SERIES[0], "train")
        self._curve(self.loss_plot, "loss/val", SERIES[2], "validation", symbol=True)
        self._curve(self.lr_plot, "lr", SERIES[1], "lr")
        self._curve(self.tps_plot, "perf/tokens_per_s", SERIES[4], "tokens/s")

        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(3000)  # bounded, however long the run
        self.log.setPlaceholderText("Engine log")
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.charts)
        split.addWidget(self.log)
        split.setSizes([560, 160])
        lay.addWidget(split, 1)
        return mon

    def _plot(self, title: str, unit: str, row: int, col: int) -> pg.PlotItem:
        p = self.charts.addPlot(row=row, col=col, title=title)
        # no grid and 1-px pens: measured, pyqtgraph's grid and 2-px strokes were
        # 85% of a 20 ms repaint; without them a repaint of all four charts is ~2 ms
        p.setLabel("bottom", "step")
        p.setLabel("left", unit)
        # "GiB (x0.001)" helps nobody: show the numbers as they are
        p.getAxis("left").enableAutoSIPrefix(False)
        p.setClipToView(True)
        p.setDownsampling(auto=True, mode="peak")
        # ranges are set by _fit_range in steps, not re-fitted on every update:
        # a changed range makes pyqtgraph re-lay out the axis ticks and labels,
        # which was most of each repaint
        p.disableAutoRange()
        return p

    def _fit_range(self, plot: pg.PlotItem) -> None:
        """Grow the plot's view in jumps only when the data leaves it."""
        xs: list[float] = []
        ys: list[float] = []
        for name, curve in self._curves.items():
            series = self.store.series.get(name)
            if (isinstance(curve, _LimitAdapter) or series is None
                    or self._plot_for(name) is not plot):
                continue
            # the series, not curve.getData(): a curve clipped to the view only
            # returns what is already in view
            x, y = series.data()
            if len(x) == 0:
                continue
            xs += [float(np.min(x)), float(np.max(x))]
            ys += [float(np.nanmin(y)), float(np.nanmax(y))]
        if plot is self.mem_plot:
            ys += [line.value() for line in self._limit_lines.values()]
        if not xs:
            return
        (vx0, vx1), (vy0, vy1) = plot.getViewBox().viewRange()
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
        fresh = self._ranged.get(id(plot)) is None
        if fresh or x1 > vx1 or x0 < vx0:
            span = max(x1 - x0, 1.0)
            plot.setXRange(x0, x0 + span * 1.25, padding=0)
        if fresh or y1 > vy1 or y0 < vy0 or (y1 - y0) < 0.25 * (vy1 - vy0):
            pad = max((y1 - y0) * 0.3, abs(y1) * 0.02, 1e-12)
            plot.setYRange(y0 - pad, y1 + pad, padding=0)
        self._ranged[id(plot)] = True

    def _curve(self, plot: pg.PlotItem, name: str, color: str, label: str,
               style: Qt.PenStyle = Qt.PenStyle.SolidLine, symbol: bool = False) -> pg.PlotDataItem:
        pen = pg.mkPen(QColor(color), width=1, style=style)
        kwargs = {"symbol": "o", "symbolSize": 5, "symbolBrush": QColor(color)} if symbol else {}
        curve = plot.plot(pen=pen, name=label, **kwargs)
        self._curves[name] = curve
        return curve

    # -- redraw ----------------------------------------------------------------------
    def _plot_for(self, name: str) -> pg.PlotItem | None:
        if name.startswith("loss/"):
            return self.loss_plot
        if name.startswith(("memory/", "host/")):
            return self.mem_plot
        if name == "lr":
            return self.lr_plot
        if name == "perf/tokens_per_s":
            return self.tps_plot
        return None

    def _tick(self) -> None:
        # one chart per tick, in turn: each chart still updates every
        # 4 x REDRAW_MS, but a tick repaints one chart's axes, not four
        plots = (self.loss_plot, self.mem_plot, self.lr_plot, self.tps_plot)
        self.redraw_ticks += 1
        self.redraw(only=plots[self._turn % len(plots)])
        self._turn += 1
        if self.job is None:
            # the run ended: one more turn over the charts, then the timer rests
            self._final_ticks -= 1
            if self._final_ticks <= 0:
                self.redraw_timer.stop()

    def redraw(self, only: pg.PlotItem | None = None) -> None:
        """Push changed series to the charts (from the timer, never per event)."""
        for name, series in list(self.store.series.items()):
            if self._versions.get(name) == series.version:
                continue
            if only is not None and self._plot_for(name) is not only:
                continue
            self._versions[name] = series.version
            curve = self._curves.get(name) or self._new_curve(name)
            if curve is None:
                continue
            x, y = series.data()
            curve.setData(x, y)
        for plot in (self.loss_plot, self.mem_plot, self.lr_plot, self.tps_plot):
            if only is None or plot is only:
                self._fit_range(plot)
        self._update_stats()
        self.redraws += 1

    def _new_curve(self, name: str) -> pg.PlotDataItem | None:
        if "@" not in name:
            return None
        key, rank = name.split("@", 1)
        if not key.startswith(("memory/", "host/")):
            return None
        ranks = self.store.ranks()
        color = SERIES[ranks.index(rank) % len(SERIES)] if rank in ranks else SERIES[0]
        leaf = key.rsplit("/", 1)[-1]
        if any(w in leaf for w in ("limit", "total", "capacity")):
            line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen(
                QColor(color), width=1, style=Qt.PenStyle.DashDotLine),
                label=f"limit w{rank}", labelOpts={"position": 0.05, "color": color})
            self.mem_plot.addItem(line)
            self._limit_lines[name] = line
            self._curves[name] = _LimitAdapter(line)
            return self._curves[name]
        if leaf not in MEMORY_CURVES:
            return None  # e.g. memory/state_gib: the plan's figures, not a live curve
        self._gpu_limit_line(rank, color)
        style = Qt.PenStyle.SolidLine
        if "reserved" in leaf:
            style = Qt.PenStyle.DashLine
        elif "peak" in leaf or "max" in leaf:
            style = Qt.PenStyle.DotLine
        label = f"w{rank} {leaf.replace('_gib', '').replace('_', ' ')}"
        return self._curve(self.mem_plot, name, color, label, style=style)

    def _gpu_limit_line(self, rank: str, color: str) -> None:
        """The device's memory, from nvidia-smi, as a line (rank r runs on the r-th GPU)."""
        key = f"gpu-limit@{rank}"
        selected = self.selected_gpus()
        if key in self._limit_lines or not rank.isdigit() or int(rank) >= len(selected):
            return
        gpu = next(g for g in self.gpus if g.index == selected[int(rank)])
        line = pg.InfiniteLine(pos=gpu.total_mib / 1024.0, angle=0, movable=False,
                               pen=pg.mkPen(QColor(color), width=1,
                                            style=Qt.PenStyle.DashDotLine),
                               label=f"GPU {gpu.index} limit",
                               labelOpts={"position": 0.05, "color": color})
        self.mem_plot.addItem(line)
        self._limit_lines[key] = line

    def _update_stats(self) -> None:
        latest = self.store.latest
        step = self.store.last_step

        def put(key: str, text: str) -> None:
            self.stat_labels[key].setText(text)

        put("step", f"{step:.0f} / {self.total_steps}" if self.total_steps else f"{step:.0f}")
        if "loss/train" in latest:
            put("loss", f"{latest['loss/train']:.4f}")
        if "loss/val" in latest:
            put("val", f"{latest['loss/val']:.4f}")
        if "lr" in latest:
            put("lr", f"{latest['lr']:.1e}")
        if "perf/tokens_per_s" in latest:
            put("tps", f"{latest['perf/tokens_per_s']:,.0f}")
        if self._t0 is not None and self.job is not None:
            put("elapsed", fmt_duration(time.monotonic() - self._t0))
        if self._train_t0 is not None and self.total_steps:
            t0, s0 = self._train_t0
            done = step - s0
            if done > 0:
                rate = (time.monotonic() - t0) / done
                put("eta", fmt_duration(rate * max(0.0, self.total_steps - step)))

    # -- run control -----------------------------------------------------------------
    def refresh(self) -> None:
        running = self.job is not None
        has_voice = self.voice is not None
        self.start_btn.setEnabled(has_voice and not running)
        self.plan_btn.setEnabled(has_voice and not running)
        self.resume_btn.setEnabled(has_voice and not running and bool(
            self.voice and any(r.checkpoints for r in voicedata.list_runs(self.voice))))
        self.stop_btn.setEnabled(running)
        self.export_btn.setEnabled(self.resume_btn.isEnabled() and self.export_job is None)
        if has_voice and not running and self._shown_voice != self.voice:
            # a new voice: preset by its data volume, and its latest run's curves
            self._shown_voice = self.voice
            s = voicedata.summarize(self.voice)  # type: ignore[arg-type]
            p = preset_for(s.usable_minutes)
            self.preset.setCurrentIndex(PRESETS.index(p))
            runs = [r for r in voicedata.list_runs(self.voice)  # type: ignore[arg-type]
                    if r.metrics_file.is_file() and r.metrics_file.stat().st_size > 0]
            self._reset_charts()
            if runs:
                self.show_run(runs[-1])

    def _reset_charts(self) -> None:
        self._history = None
        self._ranged.clear()
        for key in [k for k in self._limit_lines if k.startswith("gpu-limit@")]:
            self.mem_plot.removeItem(self._limit_lines.pop(key))
        self.store.clear()
        self._versions.clear()
        for name in [n for n in self._curves if "@" in n]:
            curve = self._curves.pop(name)
            if isinstance(curve, _LimitAdapter):
                self.mem_plot.removeItem(curve.line)
            else:
                self.mem_plot.removeItem(curve)
        for c in self._curves.values():
            c.setData([], [])
        for label in self.stat_labels.values():
            label.setText("—")
        self.state_label.setText("Idle")

    def show_run(self, run: voicedata.Run) -> None:
        """Draw a finished run from its metrics.jsonl, read in slices (runs can be long)."""
        try:
            fh = run.metrics_file.open(encoding="utf-8")
        except OSError:
            return
        self._history = fh
        self.state_label.setText(f"Last run: {run.name}")
        self._append_log("info", f"Showing {run.name} from {run.metrics_file}")
        steps = run.config.get("steps") or run.config.get("total_steps")
        if isinstance(steps, int):
            self.total_steps = steps
        self._read_history()

    def _read_history(self) -> None:
        fh = self._history
        if fh is None:
            return
        for _ in range(HISTORY_LINES_PER_SLICE):
            line = fh.readline()
            if not line:
                fh.close()
                self._history = None
                self.redraw()
                return
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                rec.pop("kind", None)
                rec.pop("time", None)
                self.store.add(rec)
        QTimer.singleShot(0, self._read_history)

    def common_args(self) -> list[str]:
        assert self.voice is not None
        args = [str(self.voice), "--base", self.base.currentText().strip(),
                "--workers", str(self.workers.value())]
        if self.remote_radio.isChecked() and self.address.text().strip():
            args += ["--address", self.address.text().strip()]
        return args

    def train_args(self, resume: bool = False) -> list[str]:
        args = ["train", *self.common_args(), "--steps", str(self.steps.value()),
                "--lr", f"{self.lr.value():g}",
                "--checkpoint-every", str(self.ckpt_every.value())]
        if resume:
            args.append("--resume")
        return args

    def download(self) -> EngineJob | None:
        """`model download`: progress here; offline, the engine's one clear sentence."""
        repo = self.base.currentText().strip()
        if not repo or self.download_job is not None:
            return None
        job = self.start_job(["model", "download", repo], "Download")
        self.download_job = job
        self.download_bar.setRange(0, 0)
        self.download_bar.show()
        self.model_note.setText(f"Downloading {repo}…")
        job.progress.connect(self._download_progress)
        job.succeeded.connect(lambda r: self.model_note.setText(str(r.get("summary", ""))))
        job.failed.connect(lambda _c, m, h: self.model_note.setText(f"{m} {h}".strip()))
        job.cancelled.connect(lambda: self.model_note.setText("Download stopped; it resumes "
                                                              "where it left off."))
        job.finished.connect(self._download_done)
        self.download_btn.setEnabled(False)
        return job

    def _download_progress(self, stage: str, done: float, total: object) -> None:
        if isinstance(total, float) and total > 0:
            self.download_bar.setRange(0, 1000)
            self.download_bar.setValue(int(1000 * done / total))
            if total > 1e6:
                self.download_bar.setFormat(f"{done / 1e9:.2f} of {total / 1e9:.2f} GB")

    def _download_done(self) -> None:
        self.download_job = None
        self.download_bar.hide()
        self.download_btn.setEnabled(True)

    def export(self) -> EngineJob | None:
        """Export the latest checkpoint of the latest run into <voice>/exports/."""
        if self.voice is None or self.export_job is not None:
            return None
        runs = [r for r in voicedata.list_runs(self.voice) if r.checkpoints]
        if not runs:
            return None
        run = max(runs, key=lambda r: r.checkpoints[-1].stat().st_mtime)
        step = voicedata.checkpoint_step(run.checkpoints[-1])
        out = self.voice / "exports" / f"{run.name}-step{step}"
        args = ["export", str(self.voice), str(out), "--run", run.name, "--step", str(step)]
        job = self.start_job(args, "Export")
        self.export_job = job
        self._append_log("info", f"Exporting {run.name} step {step} to {out}…")
        job.succeeded.connect(lambda r: self._append_log(
            "info", str(r.get("summary") or f"Exported to {out}")))
        job.finished.connect(self._export_done)
        self.refresh()
        return job

    def _export_done(self) -> None:
        self.export_job = None
        self.ctx.notify_changed()
        self.refresh()

    def plan(self) -> EngineJob | None:
        if self.voice is None:
            return None
        job = self.start_job(["plan", *self.common_args()], "Memory plan")
        self._append_log("info", "Checking the memory plan…")
        job.log.connect(self._append_log)
        job.succeeded.connect(self._plan_done)
        return job

    def _plan_done(self, result: dict) -> None:
        text = result.get("summary") or "\n".join(f"{k}: {v}" for k, v in result.items())
        self._append_log("info", str(text))

    def start(self, resume: bool = False, extra_args: list[str] | None = None,
              env: dict[str, str] | None = None,
              program: list[str] | None = None) -> EngineJob | None:
        if self.voice is None or self.job is not None:
            return None
        if self._history is not None:
            self._history.close()
        self._reset_charts()
        self._starts.clear()
        self.worker_pids.clear()
        self.total_steps = self.steps.value()
        self._t0 = time.monotonic()
        self._train_t0 = None
        if self.gpus and self.selected_gpus():
            env = {**(env or {}), "CUDA_VISIBLE_DEVICES": ",".join(map(str, self.selected_gpus()))}
        args = self.train_args(resume) + list(extra_args or [])
        # a stop saves a checkpoint and shuts Ray down: give it time before SIGKILL
        job = self.start_job(args, "Training", kill_after_s=90.0, env=env, program=program)
        self.job = job
        job.metric.connect(self._on_metric)
        job.state.connect(self._on_state)
        job.event.connect(self._on_raw_event)
        job.log.connect(self._append_log)
        job.progress.connect(self._on_progress)
        job.finished.connect(self._on_finished)
        job.succeeded.connect(lambda r: self._end_state("Finished", r))
        # the engine's own words say where it stopped and what it saved
        job.cancelled.connect(lambda: self._end_state(
            "Stopped", {"summary": job.error[1] if job.error else ""}))
        job.failed.connect(lambda _c, m, _h: self._end_state("Failed", {"summary": m}))
        self.state_label.setText("Starting…")
        self._append_log("info", "$ voxshard-engine " + " ".join(args))
        self.redraw_timer.start()
        self.refresh()
        return job

    def stop(self) -> None:
        if self.job is not None:
            self.state_label.setText(STATE_LABELS["stopping"])
            self._append_log("info", "Stopping: the engine saves a checkpoint first…")
            self.job.cancel()

    def _on_metric(self, values: dict) -> None:
        total = values.pop("total_steps", None)
        if isinstance(total, int) and total > 0:
            self.total_steps = total
        self.store.add(values)
        if self._train_t0 is None and "loss/train" in values:
            self._train_t0 = (time.monotonic(), self.store.last_step)

    def _on_raw_event(self, event: dict) -> None:
        # the engine's state events carry extras: the run's step count and folder
        if event.get("event") != "state":
            return
        if isinstance(event.get("total_steps"), int):
            self.total_steps = int(event["total_steps"])
        if event.get("state") == "worker_started" and isinstance(event.get("pid"), int):
            self.worker_pids[str(event.get("rank"))] = int(event["pid"])

    def _on_state(self, state: str, detail: str) -> None:
        if state == "worker_started":
            # a second start of any rank means Ray restarted the group after a failure
            rank = detail or "?"
            self._starts[rank] = self._starts.get(rank, 0) + 1
            if self._starts[rank] > 1:
                state, detail = "recovering", f"restart {self._starts[rank] - 1}"
            else:
                self._append_log("state", f"Worker started ({rank})")
                return
        text = STATE_LABELS.get(state, state.replace("_", " ").capitalize())
        self.state_label.setText(text + (f" — {detail}" if detail else ""))
        self._append_log("state", text + (f": {detail}" if detail else ""))

    def _on_progress(self, stage: str, done: float, total: object) -> None:
        if stage in ("train", "training", "step") and isinstance(total, float) and total:
            self.total_steps = int(total)

    def _append_log(self, level: str, message: str) -> None:
        prefix = {"warning": "⚠ ", "error": "✖ ", "state": "▸ "}.get(level, "")
        self.log.appendPlainText(f"{time.strftime('%H:%M:%S')}  {prefix}{message}")

    def _end_state(self, text: str, result: dict) -> None:
        self.state_label.setText(text)
        if result.get("summary"):
            self._append_log("info", str(result["summary"]))

    def _on_finished(self) -> None:
        # the last values reach the charts through the staggered timer too: a
        # redraw of all four at once was the longest stall of a whole run
        self._final_ticks = 4
        if not self.redraw_timer.isActive():
            self.redraw()
        self.job = None
        self.ctx.notify_changed()
        self.refresh()


class _LimitAdapter:
    """Lets a device-limit line take `setData` like a curve (it shows the last value)."""

    def __init__(self, line: pg.InfiniteLine) -> None:
        self.line = line

    def setData(self, x: object, y: object) -> None:
        try:
            values = list(y)  # type: ignore[call-overload]
        except TypeError:
            return
        if values:
            self.line.setValue(float(values[-1]))

