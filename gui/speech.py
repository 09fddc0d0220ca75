"""A warm speech engine: one `voxshard-engine serve-speech` process for the window.

Loading a model takes far longer than speaking a sentence, so the Listen page
keeps one worker process alive and sends it requests (engine/synth/worker.py
protocol: load, speak, cancel, one JSON object per line). The model is loaded
again only when the chosen voice changes.
"""

from __future__ import annotations

import itertools
from typing import Any

from PySide6.QtCore import QObject, Signal

from .jobs import EngineJob, JobManager


class SpeechService(QObject):
    finished = Signal(str, object)  # request id, result dict
    failed = Signal(str, str, str, str)  # request id, code, message, hint
    cancelled = Signal(str)  # request id
    progress = Signal(str, str, float, object)  # request id, stage, done, total
    state = Signal(str, str)  # request id, state
    partial = Signal(str, str)  # request id, path of the file that grows as it is spoken

    def __init__(self, jobs: JobManager, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.jobs = jobs
        self.job: EngineJob | None = None
        self.loaded: dict[str, Any] | None = None
        self._ids = itertools.count(1)
        self.pending: set[str] = set()

    def _ensure(self) -> EngineJob:
        if self.job is None or not self.job.is_running():
            # the worker serves until the window closes; a cancel must not kill it
            job = self.jobs.start(["serve-speech"], "Speech engine", kill_after_s=10.0,
                                  background=True)
            job.event.connect(self._on_event)
            job.finished.connect(self._on_exit)
            self.job = job
            self.loaded = None
        return self.job

    def speak(self, voice: dict[str, Any], text: str, out: str,
              options: dict[str, Any] | None = None, stream: bool = False) -> str:
        """Queue a render; returns its request id (signals carry it).

        `stream`: the file grows as the audio is generated (`partial` says when
        the first audio is in it), so it can be played before it is finished."""
        job = self._ensure()
        if voice != self.loaded:
            load_id = f"load-{next(self._ids)}"
            job.send({"op": "load", "id": load_id, **voice})
            self.pending.add(load_id)
            self.loaded = voice
        rid = f"speak-{next(self._ids)}"
        job.send({"op": "speak", "id": rid, "text": text, "out": out,
                  "options": options or {}, "stream": stream})
        self.pending.add(rid)
        return rid

    def cancel(self, rid: str | None = None) -> None:
        if self.job is not None and self.job.is_running():
            self.job.send({"op": "cancel", **({"id": rid} if rid else {})})

    def busy(self) -> bool:
        return bool(self.pending)

    def holds_model(self) -> bool:
        """The worker is up (and so may hold a model in GPU memory)."""
        return self.job is not None and self.job.is_running()

    def unload(self) -> bool:
        """End the worker so its model leaves the GPU (training or a comparison needs
        the memory); the next request starts it again. True when one was running."""
        if not self.holds_model():
            return False
        assert self.job is not None
        self.job.cancel()
        return True

    def _on_event(self, ev: dict[str, Any]) -> None:
        rid = ev.get("request")
        if not rid:
            return
        kind = ev.get("event")
        if kind == "progress":
            total = ev.get("total")
            self.progress.emit(rid, str(ev.get("stage", "")), float(ev.get("done") or 0),
                               None if total is None else float(total))
        elif kind == "state":
            self.state.emit(rid, str(ev.get("state", "")))
        elif kind == "artifact" and ev.get("role") == "speech_partial":
            self.partial.emit(rid, str(ev.get("path", "")))
        elif kind == "result":
            self.pending.discard(rid)
            data = {k: v for k, v in ev.items() if k not in ("event", "time", "request")}
            self.finished.emit(rid, data)
        elif kind == "error":
            self.pending.discard(rid)
            if rid.startswith("load-"):
                self.loaded = None  # the next speak loads again
            if ev.get("code") == "cancelled":
                self.cancelled.emit(rid)
            else:
                self.failed.emit(rid, str(ev.get("code") or "error"),
                                 str(ev.get("message") or ""), str(ev.get("hint") or ""))

    def _on_exit(self) -> None:
        job, self.job = self.job, None
        lost = sorted(self.pending)
        self.pending.clear()
        self.loaded = None
        if job is None:
            return
        code, message, hint = job.error or ("crashed", "The speech engine stopped.", "")
        for rid in lost:
            if job.outcome == "cancelled":
                self.cancelled.emit(rid)
            else:
                self.failed.emit(rid, code, message, hint)
