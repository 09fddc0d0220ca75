"""The Train page's evaluation of a run: its results read back, Evaluate now, the report,
and the evaluation beside training with its early stop. Mixed into `TrainPage`."""

from __future__ import annotations

from pathlib import Path

from engine.layout.run import Run
from gui.jobs import EngineJob
from gui.pages.train.evaluation import (
    catalog_evaluation,
    evaluation_summary,
    measured_steps,
    put_quality,
    style_lines,
)
from gui.widgets import open_in_desktop


class QualityPart:
    """A run's evaluation on the page: the quality chart, its words, and the evaluator job."""

    def show_evaluation(self, run_dir: Path | None = None) -> dict | None:
        """The run's evaluation.json (from the app or the command line) in the quality
        chart, the cards and one line of words."""
        run_dir = run_dir or self._shown_run
        data = catalog_evaluation(run_dir) if run_dir is not None else None
        if data is None:
            self.eval_note.hide()
            return None
        put_quality(self.store, data)  # the file in full: what the events drew is replaced
        steps = measured_steps(data)
        if steps:
            self.run.evaluated_step = max(self.run.evaluated_step, steps[-1])
        best = data.get("best") or {}
        if isinstance(best.get("step"), int):
            self.run.best_step = best["step"]
            self.charts.mark_best(best["step"])
        # two lines for every run (a third for a run with styles moved the tabs down at
        # 1100x760): what does not fit ends in "…" and is in the tooltip in full
        self.eval_note.setText(evaluation_summary(data))
        # every checkpoint's styles where the line has room for one
        self.eval_note.setToolTip("\n".join([self.eval_note.text(),
                                             *(line for _, line in style_lines(data))]))
        self.eval_note.show()
        self.redraw()
        self._update_run_buttons()
        return data

    def evaluate_now(self) -> EngineJob | None:
        """`evaluate` on the chosen run: every checkpoint (measured ones are reused)."""
        run = self.selected_run()
        if self.voice is None or run is None or not run.checkpoints \
                or self.evaluate_job is not None:
            return None
        args = ["evaluate", str(self.voice), "--run", run.name, *self.evaluate_extra_args]
        job = self.start_job(args, "Evaluation", voice=self.voice)
        self.evaluate_job = job
        self._append_log("info", f"Evaluating every checkpoint of {run.name}…")
        job.log.connect(self._evaluator_log)
        job.event.connect(lambda ev: self._evaluation_reported(ev, run.path, idle_only=True))
        job.succeeded.connect(lambda r: self._evaluated(run.path, r))
        job.failed.connect(lambda _c, m, h: self._append_log("error", f"{m} {h}".strip()))
        job.finished.connect(self._evaluate_done)
        self._update_run_buttons()
        return job

    def _evaluated(self, run_dir: Path, result: dict) -> None:
        self._append_log("info", str(result.get("summary") or "Evaluation finished."))
        if self._shown_run == run_dir and self.run.job is None:
            self.show_evaluation(run_dir)

    def _evaluation_reported(self, event: dict, run_dir: Path, idle_only: bool = False
                             ) -> None:
        """An evaluator wrote evaluation.json (it does before each `metric` it sends):
        the quality chart and its line of words show the file at once. `idle_only`: only
        while no training run draws the charts, and only for the run on screen."""
        kind = event.get("event")
        written = (kind == "artifact" and event.get("role") == "evaluation") \
            or (kind == "metric" and event.get("split") == "eval")
        if not written:
            return
        if idle_only and (self.run.job is not None or self._shown_run != run_dir):
            return
        self.show_evaluation(run_dir)

    def _evaluate_done(self) -> None:
        self.evaluate_job = None
        self._update_run_buttons()

    def open_report(self) -> bool:
        run = self.selected_run()
        report = Run(run.path).report_file if run is not None else None
        if report is None or not report.is_file():
            return False
        self.last_opened = report
        return open_in_desktop(self, report, "report")  # says so when nothing can open it

    def _start_evaluator(self, run_dir: Path) -> None:
        if self.voice is None or self.run.job is None or self.run.evaluator is not None:
            return
        args = self.settings.evaluate_args(str(self.voice), run_dir.name,
                                           training_pid=self.run.job.pid())
        if args is None:
            return
        job = self.start_job(args, "Evaluation", voice=self.voice,
                             program=self.evaluator_program)
        self.run.attach_evaluator(job)  # first: its handlers run before the page's
        job.log.connect(self._evaluator_log)
        job.event.connect(lambda ev: self._evaluation_reported(ev, run_dir))

    def _evaluator_log(self, level: str, message: str) -> None:
        if level != "debug":
            self._append_log(level, f"[evaluation] {message}")

    def _early_stop(self, best: int) -> None:
        if self.settings.patience.value() and self.run.job is not None \
                and not self.run.job.stopping:
            self._append_log("info", f"Early stop: step {best} stays the best checkpoint.")
            self.stop()
