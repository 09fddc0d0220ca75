"""The real `voxshard-engine --json serve` in a child process, as a user starts it: its
address once it serves, and every JSON event it writes after (the request log among them).
Used by the HTTP tests (tests/test_serve.py) and the Wyoming ones (tests/test_serve_wyoming.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai

ROOT = Path(__file__).resolve().parents[2]
ENGINE = [sys.executable, "-m", "engine.cli.main"]
KEY = "test-key-0123456789abcdef"


@dataclass
class Server:
    url: str | None
    proc: subprocess.Popen[str]
    renders: Path
    #: the `serving` event: its Wyoming address, voices, ...
    serving: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)

    def http(self, key: str | None = KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        assert self.url is not None, "this server has no HTTP endpoint"
        return httpx.Client(base_url=self.url.removesuffix("/v1"), headers=headers,
                            timeout=120)

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=120)

    def health(self) -> dict[str, Any]:
        with self.http() as http:
            return http.get("/health").json()

    def logged(self) -> list[dict[str, Any]]:
        return [e["request_log"] for e in list(self.events) if "request_log" in e]

    def logged_since(self, before: int, count: int = 1, timeout: float = 60
                     ) -> list[dict[str, Any]]:
        """The request log's lines after the first `before`, once `count` of them arrived:
        the server logs a request as it ends, after its response reached the client."""
        deadline = time.monotonic() + timeout
        while len(self.logged()) < before + count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.logged()[before:]


def start_server(args: list[str], cwd: Path) -> Server:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([*ENGINE, "--json", "serve", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        if event.get("state") == "serving":
            server = Server(event["url"], proc, Path(event["renders"]), event)
            break
        if event["event"] == "error":
            raise AssertionError(f"the server did not start: {event}")
    else:
        raise AssertionError(f"the server exited with {proc.wait()} before serving")

    def collect() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            server.events.append(json.loads(line))

    threading.Thread(target=collect, daemon=True).start()
    return server


def serve_workspace(workspace: Path, *extra: str) -> Server:
    """`serve --workspace` on the CPU: HTTP with the test key (a file beside the workspace)
    and Wyoming, each on a free port of loopback; `extra`: more of the CLI's flags."""
    root = workspace.parent
    (root / "key").write_text(KEY + "\n")
    return start_server(["--workspace", str(workspace), "--port", "0", "--api-key-file",
                         str(root / "key"), "--device", "cpu", "--dtype", "float32",
                         "--wyoming", "tcp://127.0.0.1:0", *extra], root)


async def read_until(client: Any, *types: str, timeout: float = 120) -> list[Any]:
    """Every event a `wyoming` client reads up to and including the first of `types` (or
    an error)."""
    import asyncio

    out: list[Any] = []
    while True:
        event = await asyncio.wait_for(client.read_event(), timeout)
        assert event is not None, f"the server hung up; had {[e.type for e in out]}"
        out.append(event)
        if event.type in (*types, "error"):
            return out
