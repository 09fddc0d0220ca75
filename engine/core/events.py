"""Events: how long-running engine work reports what it is doing.

Every engine operation takes an optional `on_event` callback. The CLI turns
events into progress bars or JSON lines (`--json`), the GUI reads the same
JSON lines from the engine process. Kinds:

- ``progress``: ``done``/``total`` units of ``stage`` (total may be None)
- ``log``: a human-readable line with a ``level``
- ``metric``: one dict of namespaced numbers (``loss/train``, ``memory/peak_gib``)
- ``artifact``: a file or folder was written (``path``, ``role``)
- ``state``: a coarse phase change (``starting_cluster``, ``training``...)
- ``result``: the final value of a command (a JSON-able dict)
- ``error``: a failure (``code``, ``message``, ``hint``)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

KINDS = ("progress", "log", "metric", "artifact", "state", "result", "error")


@dataclass(frozen=True)
class Event:
    kind: str
    data: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown event kind {self.kind!r}")

    def to_json(self) -> str:
        return json.dumps({"event": self.kind, "time": round(self.time, 3), **self.data},
                          ensure_ascii=False, default=_json_default)

    @staticmethod
    def from_json(line: str) -> Event:
        obj = json.loads(line)
        kind = obj.pop("event")
        t = obj.pop("time", time.time())
        return Event(kind, obj, t)


def _json_default(value: Any) -> Any:
    # numpy scalars, paths and the like
    if hasattr(value, "item"):
        return value.item()
    return str(value)


EventCallback = Callable[[Event], None]


def _ignore(_: Event) -> None:
    return None


class Emitter:
    """Small helper around an event callback, safe to call from threads."""

    def __init__(self, callback: EventCallback | None = None) -> None:
        self._callback = callback or _ignore
        self._lock = threading.Lock()

    def emit(self, kind: str, **data: Any) -> None:
        event = Event(kind, data)
        with self._lock:
            self._callback(event)

    def progress(self, stage: str, done: float, total: float | None = None, **extra: Any) -> None:
        self.emit("progress", stage=stage, done=done, total=total, **extra)

    def log(self, message: str, level: str = "info", **extra: Any) -> None:
        self.emit("log", message=message, level=level, **extra)

    def metric(self, values: dict[str, Any], **extra: Any) -> None:
        self.emit("metric", values=values, **extra)

    def artifact(self, path: str, role: str, **extra: Any) -> None:
        self.emit("artifact", path=str(path), role=role, **extra)

    def state(self, state: str, **extra: Any) -> None:
        self.emit("state", state=state, **extra)

    @property
    def callback(self) -> EventCallback:
        return self._callback


def as_emitter(on_event: EventCallback | Emitter | None) -> Emitter:
    if isinstance(on_event, Emitter):
        return on_event
    return Emitter(on_event)
