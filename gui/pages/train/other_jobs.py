"""The Train page's jobs beside a run: the base model's download, a run's export, the
cluster's preflight and the memory plan. Mixed into `TrainPage`."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from engine.layout.checkpoints import step_of
from engine.layout.exports import exports_dir
from engine.layout.run import Run
from gui.jobs import EngineJob
from gui.widgets import HowToDialog, open_in_desktop


def export_howto(out: Path, speaker: str) -> str:
    """How to use an exported model: here, from a terminal, from Python, as a server."""
    who = speaker or "the speaker name"
    return ("How to use it:\n"
            f"• Listen page: choose \"Exported: {out.name}\".\n"
            f"• Terminal: voxshard-engine speak \"{out}\" \"Hello.\" -o hello.wav\n"
            "• Python, with the official qwen-tts loader: "
            f"Qwen3TTSModel.from_pretrained(\"{out}\") then "
            f"generate_custom_voice(text, speaker=\"{who}\").\n"
            f"• Other programs: voxshard-engine serve \"{out}\" (OpenAI-compatible "
            "/v1/audio/speech on 127.0.0.1:8000).")


class OtherJobs:
    """Download, export, preflight and plan: each an engine job the page starts and reads."""

    def download(self) -> EngineJob | None:
        """`model download`: progress here; offline, the engine's one clear sentence."""
        repo = self.base.currentText().strip()
        if not repo or self.download_job is not None:
            return None
        job = self.start_job(["model", "download", repo], "Download")
        self.download_job = job
        self.download_bar.setRange(0, 0)
        self.download_bar.show()
        self.model_note.setText(f"Downloading {repo}… (Cancel it from the status bar.)")
        job.progress.connect(self._download_progress)
        job.succeeded.connect(lambda r: self.model_note.setText(str(r.get("summary", ""))))
        job.failed.connect(lambda _c, m, h: self.model_note.setText(f"{m} {h}".strip()))
        job.cancelled.connect(lambda: self.model_note.setText("Download stopped; it resumes "
                                                              "where it left off."))
        job.finished.connect(self._download_done)
        self.download_btn.setEnabled(False)
        return job

    def _download_progress(self, _stage: str, done: float, total: object) -> None:
        if isinstance(total, float) and total > 0:
            self.download_bar.setRange(0, 1000)
            self.download_bar.setValue(int(1000 * done / total))
            if total > 1e6:
                self.download_bar.setFormat(f"{done / 1e9:.2f} of {total / 1e9:.2f} GB")

    def _download_done(self) -> None:
        self.download_job = None
        self.download_bar.hide()
        self.download_btn.setEnabled(True)

    def export(self, out: Path | None = None) -> EngineJob | None:
        """Export the chosen run's best checkpoint (its evaluation's, else the latest).
        Without `out`, asks where (the voice's exports/ folder is offered) and returns None;
        the export starts when a folder is chosen."""
        if self.voice is None or self.export_job is not None:
            return None
        run = self.selected_run()
        if run is None or not run.checkpoints:
            return None
        best = Run(run.path).best()
        step = step_of(best or run.checkpoints[-1])
        if out is None:
            suggested = exports_dir(self.voice) / f"{run.name}-step{step}"
            dlg = QFileDialog(self, f"Export {run.name} step {step} as a model folder",
                              str(suggested))
            dlg.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
            dlg.setOption(QFileDialog.Option.DontUseNativeDialog)
            dlg.setLabelText(QFileDialog.DialogLabel.Accept, "Export")
            dlg.selectFile(str(suggested))
            dlg.fileSelected.connect(lambda f: self.export(Path(f)))
            self.export_dialog = dlg
            dlg.open()
            return None
        args = ["export", str(self.voice), str(out), "--run", run.name, "--step", str(step)]
        job = self.start_job(args, "Export", voice=self.voice)
        self.export_job = job
        self._append_log("info", f"Exporting {run.name} step {step}"
                                 + (" (the evaluation's best)" if best else "") + f" to {out}…")
        job.succeeded.connect(lambda r: self._exported(out, run.name, step, r))
        job.finished.connect(self._export_done)
        self.refresh()
        return job

    def _exported(self, out: Path, run: str, step: int | None, result: dict) -> HowToDialog:
        """A dialog: where the model is, how to use it, and a button to its folder."""
        self._append_log("info", str(result.get("summary") or f"Exported to {out}"))
        speaker = str(result.get("speaker") or "")
        box = HowToDialog("Model exported", f"{run} step {step} is now a model folder:\n{out}",
                          export_howto(out, speaker), self)
        box.add_action("Open folder", lambda: open_in_desktop(self, out, "folder"))
        self.export_box = box
        box.open()
        return box

    def _export_done(self) -> None:
        self.export_job = None
        self.ctx.notify_changed()
        self.refresh()

    def check_cluster(self) -> EngineJob | None:
        """`preflight` on the existing cluster: every node's answer in the list."""
        if self.voice is None:
            return None
        args = self.settings.preflight_args(str(self.voice))
        if args is None:
            return None
        job = self.start_job(args, "Cluster check")
        self._append_log("info", "Checking every node of the cluster…")
        job.event.connect(self._on_cluster_event)
        job.succeeded.connect(lambda r: self._append_log("info", str(r.get("summary") or "")))
        return job

    def _on_cluster_event(self, event: dict) -> None:
        if event.get("state") == "preflight_done" and isinstance(event.get("report"), dict):
            self.settings.show_preflight(event["report"])

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
        self._append_log("info", str(text))  # the engine's full table, for the curious
        if isinstance(result.get("provenance"), dict):
            self.settings.show_provenance(result["provenance"])
        plan = result.get("plan")
        if isinstance(plan, dict):
            self.plan_note.setText(f"Memory plan: {plan.get('words') or ''}")
            self.plan_note.show()
            self.remedies.offer("To make it fit:", [] if plan.get("fits") else
                                plan.get("changes"))
