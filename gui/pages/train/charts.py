"""The Train page's charts: loss, memory per GPU, clone quality, throughput, learning rate.

Metric events only append to bounded series (gui/metrics.py); the charts are
redrawn by the page's timer, one chart per tick and only what changed, so a
run of 100k steps draws as fast as one of 100, and eight workers cost no more
per tick than two.

Memory shows one figure per worker: the device's used memory on a GPU (what
predicts out-of-memory: allocator, CUDA context, NCCL buffers and anything
else on that GPU), the process RSS on a CPU worker; and one limit line (the
smallest device of the run). Up to three workers that is a line each over the
steps; from four workers up, lines would tangle, so it becomes one bar per
worker (now) with a marker at its peak. Legends sit in their own row under
each chart, never over the data.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QTabWidget

from gui.metrics import MetricsStore
from gui.theme import SERIES

BARS_FROM_WORKERS = 4
# the memory figure drawn per worker, best first (engine/train/metrics.py memory_values)
PRIMARY_MEMORY = ("device_used_gib", "rss_gib")
LIMIT_KEYS = ("total_gib", "limit_gib")
# the quality work's per-checkpoint figures (engine evaluation during training)
QUALITY_KEYS = {"quality/similarity": ("similarity to the speaker", SERIES[3]),
                "quality/wer": ("word error rate", SERIES[5 % len(SERIES)])}
QUALITY_BASELINE = "quality/similarity_zero_shot"


class TrainCharts(QTabWidget):
    """The charts in tabs (loss, memory, speed, learning rate, clone quality; the page
    adds its log): on a laptop screen each chart keeps a readable size instead of five
    squeezed into one view."""

    def __init__(self, store: MetricsStore) -> None:
        super().__init__()
        self.store = store
        self.views: list[pg.GraphicsLayoutWidget] = []
        # the learning rate has a tab of its own: stacked under throughput, each got
        # ~60 px at 1100x760 and their tick labels ran into each other
        train, hardware, speed, rate, quality = (self._view(t) for t in (
            "Loss", "Memory", "Speed", "LR", "Quality"))
        self.setTabToolTip(self.indexOf(rate), "Learning rate, and the update it makes per "
                           "part of the model")
        self.setMinimumHeight(260)
        # six tabs in the monitor's ~356 px at the smallest window (1024x680): short names
        # and narrower padding than the app's tabs; never scroll arrows (a click on one
        # scrolled the Loss tab out of reach), a narrower bar shortens the names instead
        self.setStyleSheet("QTabBar::tab { padding: 6px 8px; }")
        self.setUsesScrollButtons(False)
        self.setElideMode(Qt.TextElideMode.ElideRight)
        self.redraws = 0
        self.rank_labels: dict[str, str] = {}  # rank -> "GPU 3" / "node-b GPU 1"
        self.limit_gib: float | None = None  # from the GPU probe, before the engine says
        self.has_gpu = False  # the GPU probe's answer (the memory chart's title)
        self._versions: dict[str, int] = {}
        self._ranged: dict[int, bool] = {}
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.loss_plot, self.loss_legend = self._plot(train, "Loss", "loss", 0, 0)
        self.mem_plot, self.mem_legend = self._plot(hardware, "Memory per worker (process RSS)",
                                                    "GiB", 0, 0)
        self.quality_plot, self.quality_legend = self._plot(quality,
                                                            "Clone quality per checkpoint",
                                                            "score", 0, 0)
        self.tps_plot, self.tps_legend = self._plot(speed, "Throughput", "tokens/s", 0, 0)
        self.lr_plot, self.lr_legend = self._plot(rate, "Learning rate", "lr", 0, 0)
        # beside the rate, what it does: each group's update over its weights (an update
        # lost to rounding shows as a flat zero; engine/train/updates.py)
        self.update_plot, self.update_legend = self._plot(rate, "Update / weight", "ratio", 2, 0)
        self.plots = (self.loss_plot, self.mem_plot, self.quality_plot, self.tps_plot,
                      self.lr_plot, self.update_plot)
        self._build_lines()
        # plots share the height; legend rows only take what their text needs
        for view, stretches in ((train, (1, 0)), (hardware, (1, 0)), (speed, (1, 0)),
                                (rate, (1, 0, 1, 0)), (quality, (1, 0))):
            for row, stretch in enumerate(stretches):
                view.ci.layout.setRowStretchFactor(row, stretch)
        self.best_lines = []
        for plot in (self.loss_plot, self.quality_plot):
            line = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(
                QColor(SERIES[2]), width=1, style=Qt.PenStyle.DotLine),
                label="best", labelOpts={"position": 0.92, "color": SERIES[2]})
            line.hide()
            plot.addItem(line)
            self.best_lines.append(line)
        self.bars: pg.BarGraphItem | None = None
        self.peaks: pg.ScatterPlotItem | None = None
        self.mode = "lines"

    def _build_lines(self) -> None:
        """Each chart's lines, and the marks drawn over them (the zero-shot clone's level,
        the device's memory limit, the quality chart's words before an evaluation)."""
        self._line(self.loss_plot, self.loss_legend, "loss/train", SERIES[0], "train")
        self._line(self.loss_plot, self.loss_legend, "loss/val", SERIES[2], "validation",
                   symbol=True)
        self._line(self.lr_plot, self.lr_legend, "lr", SERIES[1], "learning rate")
        self._line(self.update_plot, self.update_legend, "update/talker", SERIES[0], "talker")
        self._line(self.update_plot, self.update_legend, "update/code_predictor", SERIES[4],
                   "code predictor")
        self._line(self.tps_plot, self.tps_legend, "perf/tokens_per_s", SERIES[4], "tokens/s")
        for key, (label, color) in QUALITY_KEYS.items():
            self._line(self.quality_plot, self.quality_legend, key, color, label, symbol=True)
        self.quality_plot.setYRange(0.0, 1.0, padding=0.05)
        self.baseline = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen(
            QColor(QUALITY_KEYS["quality/similarity"][1]), width=1, style=Qt.PenStyle.DashLine),
            # at the left, drawn rightwards: at 0.9 the label ran past the chart's edge
            label="zero-shot clone", labelOpts={"position": 0.02, "anchors": [(0, 1), (0, 1)]})
        self.baseline.hide()
        self.quality_plot.addItem(self.baseline)
        self.limit_line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen(
            QColor("#d14b4b"), width=1, style=Qt.PenStyle.DashDotLine),
            label="device limit", labelOpts={"position": 0.02, "color": "#d14b4b",
                                             "anchors": [(0, 1), (0, 1)]})
        self.limit_line.hide()
        self.mem_plot.addItem(self.limit_line)
        self.quality_hint = pg.TextItem("No evaluation yet",
                                        color="#8a8f98", anchor=(0.5, 0.5))
        self.quality_plot.addItem(self.quality_hint)
        self.quality_hint.setPos(0.5, 0.5)
        self.quality_plot.setXRange(0.0, 1.0, padding=0)

    # -- building -------------------------------------------------------------------
    def _view(self, title: str) -> pg.GraphicsLayoutWidget:
        view = pg.GraphicsLayoutWidget()
        self.views.append(view)
        self.addTab(view, title)
        return view

    def _plot(self, view: pg.GraphicsLayoutWidget, title: str, unit: str, row: int, col: int,
              colspan: int = 1) -> tuple[pg.PlotItem, pg.LegendItem]:
        p = view.addPlot(row=row, col=col, colspan=colspan, title=title)
        # no grid and 1-px pens: measured, pyqtgraph's grid and 2-px strokes were
        # 85% of a 20 ms repaint
        p.setLabel("bottom", "step")
        p.setLabel("left", unit)
        p.getAxis("left").enableAutoSIPrefix(False)  # "GiB (x0.001)" helps nobody
        p.setClipToView(True)
        p.setDownsampling(auto=True, mode="peak")
        # ranges grow in jumps (fit_range): a changed range re-lays out the axis
        p.disableAutoRange()
        legend = pg.LegendItem(colCount=6, labelTextSize="8pt", verSpacing=-6)
        legend.setMaximumHeight(26)
        view.addItem(legend, row=row + 1, col=col, colspan=colspan)
        return p, legend

    def _line(self, plot: pg.PlotItem, legend: pg.LegendItem, name: str, color: str,
              label: str, style: Qt.PenStyle = Qt.PenStyle.SolidLine,
              symbol: bool = False) -> pg.PlotDataItem:
        pen = pg.mkPen(QColor(color), width=1, style=style)
        kwargs = {"symbol": "o", "symbolSize": 6, "symbolBrush": QColor(color)} if symbol else {}
        curve = pg.PlotDataItem(pen=pen, **kwargs)
        plot.addItem(curve)
        legend.addItem(curve, label)
        self.curves[name] = curve
        return curve

    def plot_for(self, name: str) -> pg.PlotItem | None:
        if name.startswith("loss/"):
            return self.loss_plot
        if name.startswith(("memory/", "host/")):
            return self.mem_plot
        if name.startswith("quality/"):
            return self.quality_plot
        if name == "lr":
            return self.lr_plot
        if name.startswith("update/"):
            return self.update_plot
        if name == "perf/tokens_per_s":
            return self.tps_plot
        return None

    # -- memory ---------------------------------------------------------------------
    def _primary_leaf(self) -> str | None:
        leaves = {n.split("@", 1)[0].rsplit("/", 1)[-1] for n in self.store.series
                  if n.startswith("memory/") and "@" in n}
        return next((leaf for leaf in PRIMARY_MEMORY if leaf in leaves), None)

    def memory_names(self) -> dict[str, str]:
        """rank -> the series drawn for it (its primary memory figure)."""
        leaf = self._primary_leaf()
        if leaf is None:
            return {}
        return {r: f"memory/{leaf}@{r}" for r in self.store.ranks()
                if f"memory/{leaf}@{r}" in self.store.series}

    def _limit(self) -> float | None:
        totals = [self.store.latest[n] for n in self.store.series
                  if "@" in n and n.split("@", 1)[0].rsplit("/", 1)[-1] in LIMIT_KEYS
                  and n in self.store.latest]
        if totals:
            return min(totals)
        return self.limit_gib

    def rank_label(self, rank: str) -> str:
        return self.rank_labels.get(rank) or f"worker {rank}"

    def short_label(self, rank: str) -> str:
        """A bar's axis label: "GPU 3" -> "3", "node-b GPU 1" -> "node-b:1", else "w3"."""
        label = self.rank_labels.get(rank, "")
        if " GPU " in label:
            node, gpu = label.rsplit(" GPU ", 1)
            return f"{node}:{gpu}"
        if label.startswith("GPU "):
            return label[4:]
        return f"w{rank}"

    def _redraw_memory(self) -> None:
        names = self.memory_names()
        gpu = self._primary_leaf() == PRIMARY_MEMORY[0]
        # before the first figure the GPU probe decides: on CPU workers there is no GPU
        title = "Memory per GPU" if gpu or (not names and self.has_gpu) \
            else "Memory per worker (process RSS)"
        if self.mem_plot.titleLabel.text != title:
            self.mem_plot.setTitle(title)
        limit = self._limit()
        if limit is not None:
            self.limit_line.setValue(limit)
            self.limit_line.label.setFormat(f"device limit {limit:.1f} GiB")
            self.limit_line.show()
        if len(names) >= BARS_FROM_WORKERS:
            self._to_bars(names)
            return
        for rank, name in names.items():
            curve = self.curves.get(name)
            if curve is None:
                ranks = self.store.ranks()
                color = SERIES[ranks.index(rank) % len(SERIES)]
                curve = self._line(self.mem_plot, self.mem_legend, name, color,
                                   self.rank_label(rank))
            series = self.store.series[name]
            if self._versions.get(name) != series.version:
                self._versions[name] = series.version
                curve.setData(*series.data())

    def _to_bars(self, names: dict[str, str]) -> None:
        if self.mode != "bars":
            # drop the per-worker lines: from here on the chart is one bar per worker
            for name in [n for n in self.curves if n.startswith("memory/")]:
                curve = self.curves.pop(name)
                self.mem_plot.removeItem(curve)
                self.mem_legend.removeItem(curve)
            self.bars = pg.BarGraphItem(x=[], height=[], width=0.6,
                                        brush=QColor(SERIES[0]), pen=pg.mkPen(None))
            self.peaks = pg.ScatterPlotItem(symbol="t1", size=9, brush=QColor(SERIES[2]),
                                            pen=pg.mkPen(None))
            self.mem_plot.addItem(self.bars)
            self.mem_plot.addItem(self.peaks)
            self.mem_legend.addItem(self.bars, "used now")
            self.mem_legend.addItem(self.peaks, "peak")
            self.mode = "bars"
        ranks = list(names)
        now = [self.store.latest.get(names[r], 0.0) for r in ranks]
        peak = [float(np.nanmax(self.store.series[names[r]].data()[1])) for r in ranks]
        x = np.arange(len(ranks), dtype=float)
        assert self.bars is not None and self.peaks is not None
        self.bars.setOpts(x=x, height=now, width=0.6)
        self.peaks.setData(x=x, y=peak)
        self.mem_plot.getAxis("bottom").setTicks(
            [[(float(i), self.short_label(r)) for i, r in enumerate(ranks)]])
        gpus = all(self.rank_labels.get(r, "").startswith("GPU ") for r in ranks)
        self.mem_plot.setLabel("bottom", "GPU" if gpus else "worker")
        top = max([*peak, self._limit() or 0.0, 1e-3])
        self.mem_plot.setXRange(-0.6, len(ranks) - 0.4, padding=0)
        self.mem_plot.setYRange(0.0, top * 1.12, padding=0)

    def mark_best(self, step: int) -> None:
        """The evaluator's best checkpoint, on the loss and quality charts."""
        for line in self.best_lines:
            line.setValue(step)
            line.show()

    # -- redraw ---------------------------------------------------------------------
    def redraw(self, only: pg.PlotItem | None = None) -> None:
        """Push changed series to the charts (from the timer, never per event)."""
        for name, curve in list(self.curves.items()):
            series = self.store.series.get(name)
            if series is None or name.startswith("memory/"):
                continue
            if only is not None and self.plot_for(name) is not only:
                continue
            if self._versions.get(name) != series.version:
                self._versions[name] = series.version
                curve.setData(*series.data())
        if only is None or only is self.quality_plot:
            self.quality_hint.setVisible(not any(k in self.store.series for k in QUALITY_KEYS))
            base = self.store.latest.get(QUALITY_BASELINE)
            if base is not None:
                self.baseline.setValue(base)
                self.baseline.show()
        if only is None or only is self.mem_plot:
            self._redraw_memory()
        for plot in self.plots:
            if (only is None or plot is only) and not (plot is self.mem_plot
                                                       and self.mode == "bars"):
                self.fit_range(plot)
        self.redraws += 1

    def fit_range(self, plot: pg.PlotItem) -> None:
        """Grow the plot's view in jumps only when the data leaves it."""
        xs: list[float] = []
        ys: list[float] = []
        for name in self.curves:
            series = self.store.series.get(name)
            if series is None or self.plot_for(name) is not plot:
                continue
            # the series, not curve.getData(): a clipped curve returns only what is in view
            x, y = series.data()
            if len(x) == 0:
                continue
            xs += [float(np.min(x)), float(np.max(x))]
            ys += [float(np.nanmin(y)), float(np.nanmax(y))]
        if plot is self.mem_plot and self.limit_line.isVisible():
            ys.append(float(self.limit_line.value()))
        if plot is self.quality_plot:
            ys += [0.0, 1.0]
        if not xs:
            return
        (vx0, vx1), (vy0, vy1) = plot.getViewBox().viewRange()
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
        fresh = self._ranged.get(id(plot)) is None
        if fresh or x1 > vx1 or x0 < vx0:
            if x1 - x0 < 1.0:
                # one point (a first checkpoint's quality): in the middle, not on the edge
                half = max(1.0, 0.05 * abs(x0))
                plot.setXRange(x0 - half, x1 + half, padding=0)
            else:
                plot.setXRange(x0, x0 + (x1 - x0) * 1.25, padding=0)
        if fresh or y1 > vy1 or y0 < vy0 or (y1 - y0) < 0.25 * (vy1 - vy0):
            pad = max((y1 - y0) * 0.3, abs(y1) * 0.02, 1e-12)
            plot.setYRange(y0 - pad, y1 + pad, padding=0)
        self._ranged[id(plot)] = True

    def reset(self) -> None:
        self._ranged.clear()
        self._versions.clear()
        for name in [n for n in self.curves if n.startswith("memory/")]:
            curve = self.curves.pop(name)
            self.mem_plot.removeItem(curve)
            self.mem_legend.removeItem(curve)
        if self.bars is not None:
            self.mem_plot.removeItem(self.bars)
            self.mem_legend.removeItem(self.bars)
            self.bars = None
        if self.peaks is not None:
            self.mem_plot.removeItem(self.peaks)
            self.mem_legend.removeItem(self.peaks)
            self.peaks = None
        self.mem_plot.getAxis("bottom").setTicks(None)
        self.mem_plot.setLabel("bottom", "step")
        self.mode = "lines"
        self.limit_line.hide()
        self.baseline.hide()
        for line in self.best_lines:
            line.hide()
        self.quality_hint.show()
        self.quality_plot.setXRange(0.0, 1.0, padding=0)
        for plot in (self.loss_plot, self.mem_plot, self.tps_plot, self.lr_plot):
            # fresh axes for the next run: the last run's ranges say nothing about it
            plot.setXRange(0.0, 1.0, padding=0)
            plot.setYRange(0.0, 1.0, padding=0)
        self.mem_plot.setTitle("Memory per GPU" if self.has_gpu
                               else "Memory per worker (process RSS)")
        self.rank_labels.clear()
        for curve in self.curves.values():
            curve.setData([], [])
