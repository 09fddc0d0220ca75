"""Train: choose the base model, hardware and settings; watch the run live.

The page composes its parts (settings panel, GPU probe, stats bar, charts, run
controller, Reinforce tab; its evaluation in `quality` and its other jobs in `other_jobs`,
mixed in) and owns the redraw timer: metric events only append to the store; the timer
redraws one chart per tick, and only what changed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QComboBox,
    QLabel,
    QSizePolicy,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from engine import catalog
from engine.core.errors import WorkspaceError
from engine.layout.run import Progress, ProgressReader, Run
from engine.layout.voice import open_voice
from gui.context import AppContext
from gui.jobs import EngineJob
from gui.metrics import MetricsStore
from gui.notify import notify_if_in_background
from gui.pages.base import Page
from gui.pages.train.charts import TrainCharts
from gui.pages.train.controller import STATE_LABELS, RunController
from gui.pages.train.gpus import Gpu, GpuProbe
from gui.pages.train.other_jobs import OtherJobs
from gui.pages.train.quality import QualityPart
from gui.pages.train.reinforce import ReinforcePanel
from gui.pages.train.remedies import Remedies
from gui.pages.train.settings import PRESETS, TrainSettings, preset_for
from gui.pages.train.stats import FewLinesLabel, StatsBar
from gui.widgets import (
    ElidedComboBox,
    LogView,
    fmt_duration,
    hbox,
)

ENDED_LABELS = {"succeeded": "Finished", "cancelled": "Stopped", "failed": "Failed"}
#: the picker's entry for a run the engine has not named yet
NEW_RUN = "New run (starting…)"
#: metrics.jsonl read per redraw at most: a long run's history loads over a few turns
PROGRESS_BYTES_PER_TICK = 4 << 20


def run_label(name: str, step: int | None, total: int | None, checkpoints: int) -> str:
    """A run in the picker: its name, where it stands, what it has saved."""
    steps = f"{step or 0}/{total}" if total else f"{step or 0}"
    ckpt = f", {checkpoints} checkpoint{'s' if checkpoints != 1 else ''}" \
        if checkpoints else ""
    return f"{name}  (step {steps}{ckpt})"


class TrainPage(QualityPart, OtherJobs, Page):
    title = "Train"
    subtitle = ("Fine-tune Qwen3-TTS on this voice: one worker per GPU, sharded with FSDP2 "
                "on a Ray cluster. Stop saves a checkpoint; resume continues from it.")
    icon_name = "train"
    REDRAW_MS = 125

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.export_job: EngineJob | None = None
        self.download_job: EngineJob | None = None
        self.store = MetricsStore()
        self.run = RunController(self.store, self)
        self.redraw_ticks = 0  # turns of the redraw timer; redraws never outnumber them + 1
        self._final_ticks = 0
        self._turn = 0
        self._shown_voice: object = None
        self._shown_run: Path | None = None  # the run whose curves are on screen
        #: the shown run's step, step count and elapsed, read from its folder
        self._progress: ProgressReader | None = None
        self._before_start: catalog.RunInfo | None = None  # shown when Start was pressed
        self.last_opened: Path | None = None  # the report Open report last opened
        self._runs: list[catalog.RunInfo] = []
        self.evaluator_program: list[str] | None = None  # tests: another engine stand-in

        self._build_settings()
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.settings)
        split.addWidget(self._build_monitor())
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setSizes([380, 900])
        self.outer.addWidget(split, 1)

        self._wire_run()
        self.redraw_timer = QTimer(self)
        self.redraw_timer.setInterval(self.REDRAW_MS)
        self.redraw_timer.timeout.connect(self._tick)
        self.gpus: list[Gpu] = []
        self.probe = GpuProbe(self)
        self.probe.found.connect(self._gpus_found)
        self.probe.probe()

    def _build_settings(self) -> None:
        """The settings column, its widgets under the names scripts and tests use, and its
        buttons wired to the page."""
        self.settings = TrainSettings()
        s = self.settings
        # the form's widgets under the names scripts and tests use
        self.base, self.workers, self.steps, self.lr = s.base, s.workers, s.steps, s.lr
        self.ckpt_every, self.preset = s.ckpt_every, s.preset
        self.remote_radio, self.address = s.remote_radio, s.address
        self.start_btn, self.resume_btn, self.stop_btn = s.start_btn, s.resume_btn, s.stop_btn
        self.plan_btn, self.export_btn, self.download_btn = s.plan_btn, s.export_btn, \
            s.download_btn
        self.download_bar, self.model_note = s.download_bar, s.model_note
        s.start_btn.clicked.connect(lambda: self.start())
        s.resume_btn.clicked.connect(lambda: self.start(resume=True))
        s.stop_btn.clicked.connect(self.stop)
        s.plan_btn.clicked.connect(lambda: self.plan())
        s.export_btn.clicked.connect(lambda: self.export())
        s.download_btn.clicked.connect(lambda: self.download())
        s.preflight_btn.clicked.connect(lambda: self.check_cluster())
        s.evaluate_btn.clicked.connect(lambda: self.evaluate_now())
        s.report_btn.clicked.connect(lambda: self.open_report())
        self.evaluate_btn, self.report_btn = s.evaluate_btn, s.report_btn
        self.evaluate_job: EngineJob | None = None
        self.evaluate_extra_args: list[str] = []  # tests: a short evaluation


    def _wire_run(self) -> None:
        """What the run controller says, to the page's words, charts and remedies."""
        self.run.state_text.connect(self.state_label.setText)
        self.run.log.connect(self._append_log)
        self.run.ended.connect(self._on_ended)
        self.run.history_loaded.connect(self._history_loaded)
        self.run.run_known.connect(self._follow_live_run)
        self.run.run_known.connect(self._start_evaluator)
        self.run.best_changed.connect(self.charts.mark_best)
        self.run.early_stop.connect(self._early_stop)
        self.run.preflight.connect(self.settings.show_preflight)
        self.run.remedies.connect(lambda changes: self.remedies.offer(
            "To avoid it, change the form and start again:", changes))
        self.run.stopping.connect(self._show_stopping)
        self.steps.valueChanged.connect(lambda _v: self._update_run_buttons())
        self.settings.base_rejected.connect(lambda text: self._append_log("error", text))


    # -- layout ---------------------------------------------------------------------
    def _build_monitor(self) -> QWidget:
        mon = QWidget()
        lay = QVBoxLayout(mon)
        lay.setContentsMargins(8, 0, 0, 0)
        self.run_picker = ElidedComboBox()  # "(step 200/200, 2 che" was cut
        self.run_picker.setToolTip("Show a run's curves and load its settings into the form")
        self.run_picker.activated.connect(self._pick_run)
        self.run_picker.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.run_picker.setMinimumContentsLength(28)
        self.stats = StatsBar()
        self.state_label = self.stats.state_label
        # the picker gets the whole row: a run's name and steps are its point
        self.run_picker.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.run_picker.setMinimumContentsLength(16)
        lay.addWidget(hbox(QLabel("<b>Run</b>"), self.run_picker))
        lay.addWidget(hbox(QLabel("<b>State</b>"), self.state_label))
        self.stat_labels = self.stats.labels
        lay.addWidget(self.stats)
        # its room is kept while it is hidden, two lines of it (the whole line is its
        # tooltip): showing, hiding or lengthening it moved the tabs by 30-70 px
        self.eval_note = FewLinesLabel(2)
        self.eval_note.setObjectName("Muted")
        keep = self.eval_note.sizePolicy()
        keep.setRetainSizeWhenHidden(True)
        self.eval_note.setSizePolicy(keep)
        self.eval_note.hide()
        lay.addWidget(self.eval_note)
        self.plan_note = QLabel("")  # the memory plan, in the form's words
        self.plan_note.setObjectName("Muted")
        self.plan_note.setWordWrap(True)
        self.plan_note.hide()
        lay.addWidget(self.plan_note)
        # the engine's remedies (the plan's, a failed run's), each a button that sets a field
        self.remedies = Remedies(self.settings)
        self.remedies.applied.connect(lambda words: self._append_log("info", f"Set {words}."))
        lay.addWidget(self.remedies)
        self.charts = TrainCharts(self.store)
        self.loss_plot, self.mem_plot = self.charts.loss_plot, self.charts.mem_plot
        self._curves = self.charts.curves
        self.reinforce = ReinforcePanel(self)  # GRPO after a run (issue 33)
        self.reinforce.log.connect(self._append_log)
        self.reinforce.ended.connect(self._reinforce_ended)
        self.charts.addTab(self.reinforce, "Reinforce")
        self.log = LogView(3000)  # bounded, however long the run; follows new lines
        self.log.setPlaceholderText("Engine log")
        # the log is a tab beside the charts: on a laptop the charts need the height
        self.charts.addTab(self.log, "Log")
        lay.addWidget(self.charts, 1)
        return mon

    # -- GPUs -----------------------------------------------------------------------
    def _gpus_found(self, gpus: list[Gpu]) -> None:
        self.gpus = gpus
        self.settings.show_gpus(gpus)
        self.charts.has_gpu = bool(gpus)
        if not self.store.series:
            self.charts.mem_plot.setTitle("Memory per GPU" if gpus
                                          else "Memory per worker (process RSS)")
        if gpus:
            self.charts.limit_gib = min(g.total_mib for g in gpus) / 1024.0

    def selected_gpus(self) -> list[int]:
        return self.settings.selected_gpus()

    # -- redraw ---------------------------------------------------------------------
    @property
    def job(self) -> EngineJob | None:
        return self.run.job

    @property
    def worker_pids(self) -> dict[str, int]:
        return self.run.worker_pids

    @property
    def redraws(self) -> int:
        return self.charts.redraws

    def _tick(self) -> None:
        # one chart per tick, in turn: a tick repaints one chart's axes, not five
        plots = self.charts.plots
        self.redraw_ticks += 1
        self.redraw(only=plots[self._turn % len(plots)])
        self._turn += 1
        if self.run.job is None:
            # the run ended: one more turn over the charts, then the timer rests
            self._final_ticks -= 1
            if self._final_ticks <= 0:
                self.redraw_timer.stop()

    def redraw(self, only: Any = None) -> None:
        self._label_workers()
        self.charts.redraw(only)
        self._update_stats()

    def _label_workers(self) -> None:
        # "GPU 3" on one machine (rank r on the r-th selected GPU, unless the engine
        # says which); "node-b GPU 1" once workers run on more than one node
        nodes = {str(w.get("node")) for w in self.run.workers.values() if w.get("node")}
        for rank in self.store.ranks():
            info = self.run.workers.get(rank, {})
            gpu: object = info.get("gpu")
            if gpu is None and rank.isdigit() and len(nodes) <= 1:
                local = self.settings.gpu_for_rank(int(rank))
                gpu = local.index if local is not None else None
            parts = [str(info["node"])] if len(nodes) > 1 and info.get("node") else []
            parts.append(f"GPU {gpu}" if gpu is not None else f"worker {rank}")
            self.charts.rank_labels[rank] = " ".join(parts)

    def progress(self) -> Progress | None:
        """The shown run's step, step count and elapsed, from its folder (what the run
        picker, the cards and the progress bar all say; a restart reads the same)."""
        if self._progress is None or self._progress.run.path != self._shown_run:
            if self._shown_run is None:
                self._progress = None
                return None
            self._progress = ProgressReader(Run(self._shown_run))
        # live: a long history is read over a few redraws; a run at rest all at once
        return self._progress.read(PROGRESS_BYTES_PER_TICK if self.run.job is not None
                                   else None)

    def _update_stats(self) -> None:
        latest, put = self.store.latest, self.stats.put
        found = self.progress()
        if found is not None and found.step is not None:
            step: float = found.step
            total = found.total or self.run.total_steps
        else:  # nothing on disk yet (or an engine that names no folder): its events
            step, total = self.store.last_step, self.run.total_steps
        put("step", f"{step:.0f} / {total}" if total else f"{step:.0f}")
        for key, card, fmt in (("loss/train", "loss", "{:.4f}"), ("loss/val", "val", "{:.4f}"),
                               ("lr", "lr", "{:.1e}"), ("perf/tokens_per_s", "tps", "{:,.0f}"),
                               ("quality/similarity", "similarity", "{:.3f}"),
                               ("quality/wer", "wer", "{:.1%}")):
            if key in latest:
                put(card, fmt.format(latest[key]))
        if found is not None and found.elapsed_s is not None:
            # a run that trains: its clock goes on between records
            live = self.run.training and (found.last_time or 0.0) >= self.run.started_at
            put("elapsed", fmt_duration(found.elapsed_at(time.time()) if live
                                        else found.elapsed_s))
        self.stats.show_progress(step, total, self.run.eta_s())
        if found is not None:
            self._label_run(self._shown_run, found)

    # -- runs on disk ----------------------------------------------------------------
    def refresh(self) -> None:
        # a reinforce stage writes into a run: no training beside it
        running = self.run.job is not None or self.reinforce.job is not None
        has_voice = self.voice is not None
        self._runs = catalog.list_runs(self.voice) if self.voice is not None else []
        self.start_btn.setEnabled(has_voice and not running)
        self.plan_btn.setEnabled(has_voice and not running)
        self.resume_btn.setEnabled(has_voice and not running
                                   and any(r.checkpoints for r in self._runs))
        self.stop_btn.setEnabled(self.run.job is not None)  # training's; the stage has its own
        self.settings.set_running(running)
        self._fill_run_picker()
        if has_voice and not running and self._shown_voice != self.voice:
            # a new voice: preset by its data volume, then its latest run, settings and
            # all (Resume and Export act on it: the form must say what they will use)
            self._shown_voice = self.voice
            report = catalog.quality_report(self.voice) or {}
            p = preset_for((report.get("totals") or {}).get("minutes_usable"))
            self.preset.setCurrentIndex(PRESETS.index(p))
            self._reset_charts()
            self._load_reinforce_settings()
            latest = catalog.latest_run(self._runs)
            if latest is not None:
                self.run_picker.setCurrentIndex(max(0, self.run_picker.findData(
                    str(latest.path))))
                self.show_run(latest)
        self._update_run_buttons()

    def selected_run(self) -> catalog.RunInfo | None:
        """The run on screen (the picker's), which Resume, Export and Evaluate act on."""
        path = self.run_picker.currentData()
        return next((r for r in self._runs if str(r.path) == path), None)

    def _update_run_buttons(self) -> None:
        # the reinforce stage writes checkpoints into the run: nothing else acts on it then
        staging = self.reinforce.job is not None
        running = self.run.job is not None or staging
        run = self.selected_run()
        ckpts = bool(run is not None and run.checkpoints)
        # the engine refuses to resume a run that went on into the reinforce stage
        refusal = Run(run.path).resume_refusal() if run is not None and ckpts else None
        # trained to the form's step count (by epochs: its own): a resume does nothing
        finished = ckpts and run is not None and Run(run.path).finished(
            self.settings.fields["steps"].value())
        self.resume_btn.setEnabled(self.voice is not None and not running and ckpts
                                   and not finished and refusal is None)
        self.export_btn.setEnabled(self.voice is not None and ckpts and not staging
                                   and self.export_job is None)
        self.evaluate_btn.setEnabled(self.voice is not None and ckpts and not staging
                                     and self.evaluate_job is None)
        report = Run(run.path).report_file if run is not None else None
        self.report_btn.setEnabled(report is not None and report.is_file())
        if staging:
            self.state_label.setText("Reinforce stage running: see the Reinforce tab")
        if run is None:
            note = ("A new run is starting…" if running
                    else "No run yet: Start training begins one.")
        elif staging:
            note = (f"The reinforce stage adds checkpoints to {run.name}: Resume, Export and "
                    "Evaluate wait for it to end.")
        elif refusal is not None and not running:
            note = f"{refusal.message} {refusal.window_hint or ''} Export and Evaluate act on it."
        elif finished and not running:
            # the run's own step count (its latest checkpoint's, at least), not the form's
            trained = max(run.total_steps or 0, max(run.checkpoint_steps, default=0))
            note = (f"{run.name} has trained all its {trained} steps: raise Steps "
                    "to resume it. Export, Evaluate and Reinforce act on it.")
        else:
            note = f"Resume, Export, Evaluate and Reinforce act on the run {run.name}."
        self.settings.run_note.setText(note)
        self.reinforce.update_buttons()

    def _load_reinforce_settings(self) -> None:
        assert self.voice is not None
        try:
            self.reinforce.load_voice_settings(open_voice(self.voice).reinforce_config)
        except WorkspaceError as exc:
            self.reinforce.state.setText(exc.message)

    def _reinforce_ended(self, outcome: str) -> None:
        """The stage wrote checkpoints into the run: the picker, the cards and the
        evaluation say what the run holds now."""
        self.state_label.setText(f"Reinforce stage: {ENDED_LABELS.get(outcome, outcome).lower()}")
        self.ctx.notify_changed()
        self.refresh()
        self.show_evaluation()

    def _fill_run_picker(self) -> None:
        current = self.run_picker.currentData()
        starting = self.run.job is not None and self.run.run_dir is None \
            and self._shown_run is None
        self.run_picker.blockSignals(True)
        self.run_picker.clear()
        if starting:
            self.run_picker.addItem(NEW_RUN, None)
        elif not self._runs:
            self.run_picker.addItem("No runs yet", None)
        for r in reversed(self._runs):
            self.run_picker.addItem(run_label(r.name, r.last_step, r.total_steps,
                                              len(r.checkpoints)), str(r.path))
        i = 0 if starting else self.run_picker.findData(current)
        self.run_picker.setCurrentIndex(max(0, i))
        self.run_picker.blockSignals(False)
        self.run_picker.setEnabled(bool(self._runs) and self.run.job is None)

    def _label_run(self, path: Path | None, found: Progress) -> None:
        """The picker's entry of the shown run says the step the cards say."""
        i = self.run_picker.findData(str(path)) if path is not None else -1
        info = next((r for r in self._runs if r.path == path), None)
        if i < 0 or info is None:
            return
        text = run_label(info.name, found.step, found.total, len(info.checkpoints))
        if self.run_picker.itemText(i) != text:
            self.run_picker.setItemText(i, text)

    def _pick_run(self, index: int) -> None:
        path = self.run_picker.itemData(index)
        run = next((r for r in self._runs if str(r.path) == path), None)
        if run is not None and self.run.job is None:
            self._reset_charts()
            self.show_run(run)
        self._update_run_buttons()

    def _follow_live_run(self, run_dir: Path) -> None:
        """The picker shows the live run (the charts draw it) once the engine names it."""
        if self.voice is None:
            return
        self._shown_run = run_dir  # its step and time now come from its folder
        self._runs = catalog.list_runs(self.voice)
        self._fill_run_picker()
        i = self.run_picker.findData(str(run_dir))
        if i >= 0:
            self.run_picker.setCurrentIndex(i)
        self._update_run_buttons()

    def show_run(self, run: catalog.RunInfo, load_settings: bool = True) -> None:
        """Draw a run from its metrics.jsonl; by default also load its settings."""
        if load_settings and run.config:
            self.settings.load_run_config(run.config)
            self.settings.show_provenance(Run(run.path).provenance())
            self._append_log("info", f"Loaded the settings of {run.name} into the form.")
        self.run.run_dir = run.path
        self._shown_run = run.path
        self.reinforce.show_run(run.path)
        if not self.run.show_run(run.name, run.metrics_file, run.total_steps):
            self._history_loaded()

    def _history_loaded(self) -> None:
        self.show_evaluation()
        self.redraw()

    # -- evaluation results ------------------------------------------------------------
    @property
    def _history(self) -> object:
        return self.run._history

    def _reset_charts(self) -> None:
        self.run.close_history()
        self.store.clear()
        self.charts.reset()
        self.stats.clear()

    # -- run control -----------------------------------------------------------------
    def train_args(self, resume: bool = False) -> list[str]:
        assert self.voice is not None
        run = self.selected_run() if resume else None
        return self.settings.train_args(str(self.voice), resume,
                                        run.name if run is not None else None)

    def common_args(self) -> list[str]:
        assert self.voice is not None
        return self.settings.common_args(str(self.voice))

    def start(self, resume: bool = False, extra_args: list[str] | None = None,
              env: dict[str, str] | None = None,
              program: list[str] | None = None) -> EngineJob | None:
        if self.voice is None or self.run.job is not None or self.reinforce.job is not None:
            return None
        if program is None and not resume and not self.settings.check_base():
            # training would refuse it after starting: say so now, the run on screen stays
            self.state_label.setText("Not started: " + self.settings.model_note.text())
            return None
        self._make_room_on_gpus()
        self._before_start = self.selected_run()
        resumed = self._before_start if resume else None
        self._reset_charts()
        # the Reinforce tab too: a new run has no stage (not the run shown before's)
        self.reinforce.show_run(resumed.path if resumed is not None else None)
        self.log.clear()  # the log is this run's: the last one's lines are in its folder
        # a new run is not the one shown before: until the engine names its folder, the
        # cards and the picker say it is starting
        self._shown_run = resumed.path if resumed is not None else None
        # nor is its evaluation: the line and Open report come back with the run's own
        self.eval_note.clear()
        self.eval_note.hide()
        self.report_btn.setEnabled(False)
        self.remedies.offer("", [])  # the last plan's or failure's, not this run's
        if resumed is not None:
            self._append_log("info", f"Resuming {resumed.name} with its saved settings.")
        if self.gpus and self.selected_gpus():
            env = {**(env or {}), "CUDA_VISIBLE_DEVICES": ",".join(map(str, self.selected_gpus()))}
        args = self.train_args(resume) + list(extra_args or [])
        # no kill timer: a stop saves a checkpoint, which may take minutes
        job = self.start_job(args, "Training", env=env, program=program, voice=self.voice)
        # a resume: the whole history on screen, the run's steps so far, then live ones
        # the step count the form gives, else the engine's (by epochs) once it says it
        steps = self.settings.fields["steps"].value()
        self.run.attach(job, steps or 0,
                        history=resumed.metrics_file if resumed is not None else None)
        job.finished.connect(self._on_finished)
        # the window's words, not the command's flags (the run's config.json has them all)
        chosen = self.settings.chosen_preset()
        length = (f"{steps} steps" if steps else "the preset " + chosen.name if chosen
                  else f"{self.settings.epochs.value():g} epochs")
        self._append_log("info", (f"Training resumed, to step {steps}." if steps else
                                  "Training resumed to its own length.")
                         if resumed is not None else "Training started with the settings in "
                         f"the form: {length}.")
        self.redraw_timer.start()
        self.refresh()
        return job

    # -- evaluation beside training ------------------------------------------------------
        # what it measures, the engine's watcher says as it starts (its log joins this one)

    def _make_room_on_gpus(self) -> None:
        """The warm speech worker may hold a model on these GPUs: end it first."""
        if self.gpus and self.ctx.speech.unload():
            self._append_log("info", "Unloaded the speech model from the GPU to make room "
                                     "for training; Listen loads it again when needed.")

    def stop(self) -> None:
        self.run.stop()

    def _show_stopping(self) -> None:
        """A stop was asked for (here, from the status bar or by Quit): the next press
        forces it."""
        self.stop_btn.setText("Force stop")
        self.stop_btn.setToolTip("Kill the run now: a checkpoint being saved is lost "
                                 "(earlier checkpoints are safe)")

    def _on_ended(self, outcome: str, summary: str) -> None:
        label = ENDED_LABELS.get(outcome, outcome)
        if summary:
            self._append_log("error" if outcome == "failed" else "info", summary)
        if outcome == "failed" and self.run.run_dir is None and not self.run.metrics_seen:
            # it failed before it named a run or trained a step: no new run exists, so the
            # run shown before Start is shown again, as it was
            self._show_again(self._before_start)
            label = "Not started: " + (summary or "see the log.")
        self.state_label.setText(label)
        notify_if_in_background(self, f"Training {label.lower()}",
                                summary or f"The run of {self.voice.name if self.voice else ''} "
                                           f"{label.lower()}.")

    def _show_again(self, run: catalog.RunInfo | None) -> None:
        self._shown_run = None
        self._runs = catalog.list_runs(self.voice) if self.voice is not None else []
        self._fill_run_picker()
        if run is not None:
            self.run_picker.setCurrentIndex(max(0, self.run_picker.findData(str(run.path))))
            # drawn from its file once: a resume had read its history in already
            self._reset_charts()
            self.show_run(run, load_settings=False)

    def _on_finished(self) -> None:
        if self.run.evaluator is not None:  # it ends itself once each is accounted for
            self._append_log("info", "Training ended; the evaluation measures or notes the "
                                     "checkpoints it has not yet, then ends.")
        self.stop_btn.setText("Stop")
        self.stop_btn.setToolTip("Saves a checkpoint, then stops; press again to force")
        # the last values reach the charts through the staggered timer too
        self._final_ticks = len(self.charts.plots)
        if not self.redraw_timer.isActive():
            self.redraw()
        self.ctx.notify_changed()
        self.refresh()

    def _append_log(self, level: str, message: str) -> None:
        prefix = {"warning": "⚠ ", "error": "✖ ", "state": "▸ "}.get(level, "")
        self.log.append_line(f"{time.strftime('%H:%M:%S')}  {prefix}{message}")

    # -- other jobs: download, export, plan --------------------------------------------

__all__ = ["STATE_LABELS", "TrainPage"]
