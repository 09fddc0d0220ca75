"""Issue 50: a download that fails (the hub unreachable) gives the window its own remedy,
not the command line's "run the same command again": the real `model download` with the
hub pointed at an address where nothing listens, its JSON error read as the window does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_failed_download_says_what_to_do_in_the_windows_words(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "0",
           "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run([sys.executable, "-m", "engine.cli.main", "--json", "model",
                           "download", "Qwen/Qwen3-TTS-12Hz-0.6B-Base"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    events = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert done.returncode == 1 and events, done.stderr[-2000:]
    error = events[-1]
    assert error["event"] == "error" and error["code"] == "model", error
    assert "same command" in error["hint"]  # the command line's words stay its own
    assert "command" not in error["window_hint"] and "press" in error["window_hint"], error
