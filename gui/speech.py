"""A warm speech engine: one `voxshard-engine serve-speech` process for the window.

Loading a model takes far longer than speaking a sentence, so the Listen page
keeps one worker process alive and sends it requests (engine/synth/worker.py
protocol: load, speak, cancel, one JSON object per line). The model is loaded
again only when the chosen voice changes. While the Serve page runs a server that
serves the chosen source, requests go to it instead (`served_speech`): one warm
worker, shared by the window and other programs.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from gui.jobs import EngineJob, JobManager
from gui.served_speech import ServedEndpoint, ServedRequest, _Bridge


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
        #: the Serve page's running server (None: not running)
        self.endpoint: ServedEndpoint | None = None
        self._served: dict[str, ServedRequest] = {}
        self._bridge = _Bridge(self)
        self._bridge.event.connect(self._on_served)

    def set_endpoint(self, endpoint: ServedEndpoint | None) -> None:
        """The Serve page's server started (or stopped: None). A model the window's own
        worker holds that the server also serves is let go: the server's copy speaks."""
        self.endpoint = endpoint
        if (endpoint is not None and self.loaded is not None
                and endpoint.name_for(self.loaded) is not None and not self.pending):
            self.unload()

    def served_name(self, voice: dict[str, Any]) -> str | None:
        """The server's name for this source when the running server serves it."""
        return self.endpoint.name_for(voice) if self.endpoint is not None else None

    def needs_load(self, voice: dict[str, Any]) -> bool:
        """Whether speaking `voice` loads a model first (not when it is served)."""
        return self.served_name(voice) is None and voice != self.loaded

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
        name = self.served_name(voice)
        if name is not None and self.endpoint is not None:
            rid = f"speak-{next(self._ids)}"
            request = ServedRequest(self.endpoint, name, rid, text, Path(out), options or {},
                                    stream, self._bridge)
            self._served[rid] = request
            self.pending.add(rid)
            request.start()
            return rid
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
        for key, request in list(self._served.items()):
            if rid is None or key == rid:
                request.cancel()
        if rid is not None and rid in self._served:
            return
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

    def _on_served(self, rid: str, kind: str, data: Any) -> None:
        """A served request's report, on the window's thread."""
        if kind == "partial":
            self.partial.emit(rid, str(data))
            return
        self._served.pop(rid, None)
        self.pending.discard(rid)
        if kind == "finished":
            self.finished.emit(rid, data)
        elif kind == "cancelled":
            self.cancelled.emit(rid)
        else:
            code, message, hint = data
            self.failed.emit(rid, code, message, hint)

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
                # the window's words for the remedy where the engine has them (no flags)
                self.failed.emit(rid, str(ev.get("code") or "error"),
                                 str(ev.get("message") or ""),
                                 str(ev.get("window_hint") or ev.get("hint") or ""))

    def _on_exit(self) -> None:
        job, self.job = self.job, None
        # requests on the server are not this worker's: they go on
        lost = sorted(self.pending - set(self._served))
        self.pending -= set(lost)
        self.loaded = None
        if job is None:
            return
        code, message, hint = job.error or ("crashed", "The speech engine stopped.", "")
        for rid in lost:
            if job.outcome == "cancelled":
                self.cancelled.emit(rid)
            else:
                self.failed.emit(rid, code, message, hint)
