"""How CLI events reach a person (human mode) or a program (`--json`)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

from engine.core.events import Event


class JsonOutput:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def _write(self, event: Event) -> None:
        self.stream.write(event.to_json() + "\n")
        self.stream.flush()

    def handle(self, event: Event) -> None:
        self._write(event)

    def result(self, data: dict[str, Any]) -> None:
        self._write(Event("result", data))

    def error(self, code: str, message: str, hint: str | None,
              window_hint: str | None = None, named: dict[str, Any] | None = None) -> None:
        data: dict[str, Any] = {"code": code, "message": message, "hint": hint}
        if window_hint:
            data["window_hint"] = window_hint  # the window's words for the same remedy
        if named:
            # the settings the error names and its texts with them as "{path}", so the
            # window words them as its fields' labels
            data.update(named)
        self._write(Event("error", data))


class HumanOutput:
    """Progress bars and log lines on stderr; the result summary on stdout."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._bar_open = False
        self._last_draw = 0.0
        self._tty = stream.isatty()

    def _end_bar(self) -> None:
        if self._bar_open:
            self.stream.write("\n")
            self._bar_open = False

    def handle(self, event: Event) -> None:
        d = event.data
        if event.kind == "progress":
            self._progress(d)
        elif event.kind == "log":
            if d.get("level") == "debug":
                return
            self._end_bar()
            prefix = "warning: " if d.get("level") == "warning" else ""
            self.stream.write(f"{prefix}{d.get('message', '')}\n")
        elif event.kind == "state":
            self._end_bar()
            self.stream.write(f"[{d.get('state')}] {d.get('detail', '')}".rstrip() + "\n")
        elif event.kind == "metric":
            self._metric(d)
        elif event.kind == "artifact":
            self._end_bar()
            self.stream.write(f"wrote {d.get('path')}\n")
        self.stream.flush()

    def _progress(self, d: dict[str, Any]) -> None:
        done, total = d.get("done", 0), d.get("total")
        now = time.monotonic()
        finished = total is not None and done >= total
        if not finished and now - self._last_draw < 0.1:
            return
        self._last_draw = now
        stage = d.get("stage", "")
        if total:
            frac = max(0.0, min(1.0, done / total))
            bar = "#" * int(frac * 30)
            line = f"{stage:<12} [{bar:<30}] {done:g}/{total:g}"
        else:
            line = f"{stage:<12} {done:g}"
        if self._tty:
            self.stream.write("\r" + line)
            self._bar_open = True
            if finished:
                self._end_bar()
        elif finished:
            self.stream.write(line + "\n")

    def _metric(self, d: dict[str, Any]) -> None:
        values = d.get("values", {})
        if "loss/train" not in values:
            return
        self._end_bar()
        parts = [f"step {values.get('step', '?')}", f"loss {values['loss/train']:.4f}"]
        if "lr" in values:
            parts.append(f"lr {values['lr']:.2e}")
        if "perf/tokens_per_s" in values:
            parts.append(f"{values['perf/tokens_per_s']:.0f} tok/s")
        self.stream.write("  ".join(parts) + "\n")

    def result(self, data: dict[str, Any]) -> None:
        self._end_bar()
        text = data.get("summary") if isinstance(data, dict) else None
        if text:
            sys.stdout.write(str(text).rstrip() + "\n")
        elif data:
            sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
        sys.stdout.flush()

    def error(self, code: str, message: str, hint: str | None,
              window_hint: str | None = None, named: dict[str, Any] | None = None) -> None:
        del window_hint, named  # a terminal: the flags' words
        self._end_bar()
        if code == "cancelled":
            self.stream.write("Cancelled.\n")
        else:
            self.stream.write(f"error: {message}" + (f" {hint}" if hint else "") + "\n")
        self.stream.flush()
