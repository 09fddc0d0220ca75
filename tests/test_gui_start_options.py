"""Issue 50: `voxshard --help` and `voxshard --version` print and exit, as a command does,
without opening the window (the installed console script, in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gui import __version__

ROOT = Path(__file__).resolve().parents[1]


def _voxshard(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "voxshard"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "gui.start"]
    # offscreen: a window that opened would stay open, and the run would time out
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={**os.environ, "QT_QPA_PLATFORM": "offscreen",
                                         "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage_and_exits(flag: str) -> None:
    done = _voxshard(flag)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: voxshard [VOICE_FOLDER]")
    assert "--version" in done.stdout and "voxshard-engine --help" in done.stdout


def test_version_prints_the_version_and_exits() -> None:
    done = _voxshard("--version")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"voxshard {__version__}"
