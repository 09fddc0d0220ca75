"""Listen through the running server: one warm worker for the app and other programs.

When the Serve page runs a server that serves the source chosen on Listen (the
same export folder or checkpoint, as the server's `serving` event says), the
Listen page's requests go to that server's `POST /v1/audio/speech` instead of
the window's own `serve-speech` process. The model is then loaded once, and
Listen's requests are batched with the other programs' by the same worker.

Each request runs on a plain thread (the window never waits on the network)
that streams the WAV body into the render file, so playback can start on the
first samples as with the window's own worker; the finished file gets its real
sizes written into the header. Closing the connection cancels the request on
the server (it cancels the rows of a client that hangs up).
"""

from __future__ import annotations

import http.client
import json
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from PySide6.QtCore import QObject, Signal

from engine.audio.timebase import SAMPLE_RATE
from engine.serve.formats import wav_data_offset

#: seconds without a byte from the server before the request fails (a render that
#: streams sends bytes as each piece is generated; a whole render can take long)
READ_TIMEOUT_S = 600.0


def _same(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


@dataclass(frozen=True)
class ServedEndpoint:
    """A running server, as its `serving` event described it."""

    #: the API's base, e.g. http://127.0.0.1:8000/v1 (a wildcard host is reached on loopback)
    url: str
    key: str | None = None
    #: served name -> the export folder or checkpoint its worker loads
    loads: dict[str, str] = field(default_factory=dict)

    def name_for(self, spec: dict[str, Any]) -> str | None:
        """The served name that loads what a Listen `load` spec asks for, if any.

        A zero-shot spec (base model plus reference clip) is never served: the
        server clones from a reference only on a worker of its own."""
        target = spec.get("voice")
        if not target or spec.get("reference"):
            return None
        return next((name for name, path in sorted(self.loads.items()) if _same(path, target)),
                    None)

    def address(self) -> tuple[str, int, str]:
        parts = urlsplit(self.url)
        host = parts.hostname or "127.0.0.1"
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1" if host == "0.0.0.0" else "::1"
        return host, parts.port or 80, parts.path.rstrip("/")


def finish_wav(path: Path) -> int:
    """Write the real sizes into a streamed WAV's header; returns its sample count."""
    with open(path, "r+b") as fh:
        head = fh.read(4096)
        offset = wav_data_offset(head)
        if offset is None:
            raise ValueError(f"{path.name} is not a WAV file")
        size = os.fstat(fh.fileno()).st_size
        data = (size - offset) // 2 * 2
        fh.truncate(offset + data)
        fh.seek(4)
        fh.write(struct.pack("<I", offset + data - 8))
        fh.seek(offset - 4)
        fh.write(struct.pack("<I", data))
    return data // 2


class _Bridge(QObject):
    # request id, kind ("partial", "finished", "failed", "cancelled"), data
    event = Signal(str, str, object)


class ServedRequest:
    """One render through the server, on its own thread; reports through `bridge`."""

    def __init__(self, endpoint: ServedEndpoint, name: str, rid: str, text: str, out: Path,
                 options: dict[str, Any], stream: bool, bridge: _Bridge) -> None:
        self.endpoint, self.name, self.rid = endpoint, name, rid
        self.text, self.out, self.options, self.stream = text, out, options, stream
        self.bridge = bridge
        self._conn: http.client.HTTPConnection | None = None
        self._cancelled = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"served-{rid}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def cancel(self) -> None:
        """Hang up: the server cancels the request's rows; the partial file is removed."""
        self._cancelled.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(2)  # wakes the thread blocked in a read
            except OSError:
                pass

    def _emit(self, kind: str, data: Any = None) -> None:
        self.bridge.event.emit(self.rid, kind, data)

    def _run(self) -> None:
        try:
            self._emit("finished", self._render())
        except _Cancelled:
            self.out.unlink(missing_ok=True)
            self._emit("cancelled")
        except _Refused as exc:
            self.out.unlink(missing_ok=True)
            self._emit("failed", (exc.code, exc.message, exc.hint))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.out.unlink(missing_ok=True)
            if self._cancelled.is_set():
                self._emit("cancelled")
            else:
                self._emit("failed", (
                    "server", f"The server on the Serve page stopped answering ({exc}).",
                    "Check the Serve page; stop the server to speak with the window's own "
                    "engine."))
        finally:
            if self._conn is not None:
                self._conn.close()

    def _render(self) -> dict[str, Any]:
        host, port, base = self.endpoint.address()
        options = dict(self.options)
        instruct = options.pop("instruct", None)
        body = {"model": "voxshard", "voice": self.name, "input": self.text,
                "response_format": "wav", **options}
        if instruct:
            body["instructions"] = instruct  # OpenAI's name for the worker's "instruct"
        if self.stream:
            body["stream_format"] = "audio"
        headers = {"Content-Type": "application/json"}
        if self.endpoint.key:
            headers["Authorization"] = f"Bearer {self.endpoint.key}"
        self._conn = http.client.HTTPConnection(host, port, timeout=READ_TIMEOUT_S)
        if self._cancelled.is_set():
            raise _Cancelled
        self._conn.request("POST", f"{base}/audio/speech", body=json.dumps(body),
                           headers=headers)
        resp = self._conn.getresponse()
        if resp.status != 200:
            raise _Refused.from_body(resp.status, resp.read())
        written, announced = 0, False
        with open(self.out, "wb") as fh:
            while True:
                piece = resp.read1(1 << 16)
                if self._cancelled.is_set():
                    raise _Cancelled
                if not piece:
                    break
                fh.write(piece)
                fh.flush()
                written += len(piece)
                if self.stream and not announced and written > 64:
                    # the header and the first samples are on disk: playback can start
                    announced = True
                    self._emit("partial", str(self.out))
        samples = finish_wav(self.out)
        seconds = samples / SAMPLE_RATE
        return {"path": str(self.out), "duration_s": round(seconds, 3), "served_by": self.name,
                "summary": f"Saved {self.out.name} ({seconds:.1f} s), spoken by the Serve "
                           f"page's server ({self.name})."}


class _Cancelled(Exception):
    pass


class _Refused(Exception):
    """The server answered with an error (OpenAI's error JSON)."""

    def __init__(self, code: str, message: str, hint: str) -> None:
        super().__init__(message)
        self.code, self.message, self.hint = code, message, hint

    @classmethod
    def from_body(cls, status: int, raw: bytes) -> _Refused:
        try:
            err = json.loads(raw.decode("utf-8", "replace")).get("error") or {}
        except (ValueError, AttributeError):
            err = {}
        message = str(err.get("message") or f"The server answered {status}.")
        hint = ("Wait for the other requests to finish, or speak again in a moment."
                if status == 429 else "See the Serve page's request log.")
        return cls(str(err.get("code") or status), message, hint)
