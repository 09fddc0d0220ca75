"""Fixtures and helpers shared by the GUI tests (no tests here).

- `settings`: a QSettings in a temporary INI file, so tests never touch the
  user's configuration.
- `ctx`, `window`: an AppContext / MainWindow on a temporary workspace; the
  window is shut down after the test (jobs, streams, timers).
- `pulse`: a running PulseAudio daemon with a null sink as the default sink
  and its monitor as the default source (started here when not running).
- `flood_program`: a process speaking the engine's event protocol (metrics, fast).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def settings(tmp_path: Path) -> QSettings:
    return QSettings(str(tmp_path / "voxshard.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    return ws


@pytest.fixture
def ctx(qapp: object, settings: QSettings, workspace: Path) -> Iterator[object]:
    from gui.context import AppContext

    settings.setValue("workspace", str(workspace))
    c = AppContext(settings)
    yield c
    c.player.stop()
    c.jobs.shutdown(10000)


@pytest.fixture
def window(qtbot: object, ctx: object) -> Iterator[object]:
    from gui.app import MainWindow

    w = MainWindow(ctx)  # type: ignore[arg-type]
    qtbot.addWidget(w)  # type: ignore[attr-defined]
    w.show()
    yield w
    w.shutdown()


def make_voice(workspace: Path, speaker: str = "Ada") -> Path:
    from engine.layout.voice import create_voice

    return create_voice(workspace / speaker.lower(), speaker).path


@pytest.fixture
def voice(workspace: Path) -> Path:
    return make_voice(workspace)


def _pulse_running() -> bool:
    if not shutil.which("pactl"):
        return False
    return subprocess.run(["pactl", "info"], capture_output=True, timeout=10).returncode == 0


@pytest.fixture(scope="session")
def pulse() -> str:
    """A real sound device: PulseAudio null sink `vsink`, its monitor as default source."""
    if not shutil.which("pulseaudio"):
        pytest.skip("PulseAudio is not installed (apt-get install pulseaudio libportaudio2)")
    if not _pulse_running():
        subprocess.run(["pulseaudio", "--daemonize=yes", "--exit-idle-time=-1", "-n",
                        "--load=module-null-sink sink_name=vsink",
                        "--load=module-native-protocol-unix"],
                       capture_output=True, timeout=30)
        deadline = time.monotonic() + 10
        while not _pulse_running() and time.monotonic() < deadline:
            time.sleep(0.1)  # daemon start-up, outside any Qt test
    if not _pulse_running():
        pytest.skip("PulseAudio could not be started")
    sinks = subprocess.run(["pactl", "list", "short", "sinks"], capture_output=True,
                           text=True, timeout=10).stdout
    if "vsink" not in sinks:
        subprocess.run(["pactl", "load-module", "module-null-sink", "sink_name=vsink"],
                       capture_output=True, timeout=10)
    subprocess.run(["pactl", "set-default-sink", "vsink"], check=True, timeout=10)
    subprocess.run(["pactl", "set-default-source", "vsink.monitor"], check=True, timeout=10)
    return "vsink"


def flood_program(count: int, forever: bool = False, child: bool = False,
                  rate: float = 0.0, ranks: int = 2, stop_s: float = 0.0,
                  stop_fails: bool = False, gpu: bool = False,
                  run: str | None = None) -> list[str]:
    """A process speaking the engine's event protocol with the engine's own writer.

    It streams `count` metric events, `rate` per second (0: as fast as it
    can), or forever until SIGTERM, then a result; events cycle through `ranks`
    workers (step = event index, as the page keys points by step); `child` also
    starts a grandchild process in the same group, to prove a cancel reaches it.
    On SIGTERM it "saves" for `stop_s` seconds as training does (state
    `stopping`), then exits as cancelled, or, with `stop_fails`, as a failed save.
    `gpu` adds the memory figures a GPU worker reports (device used and total,
    80 GiB devices); `run` names the run folder in the first state event.
    """
    code = f"""
import os, signal, subprocess, sys, time
from engine.cli.output import JsonOutput
from engine.core.events import Emitter
out = JsonOutput(sys.stdout)
em = Emitter(out.handle)
if {child!r}:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    em.log("grandchild %d" % p.pid)
stop = []
def term(*_):
    stop.append(True)  # handled in the loop: a write here could re-enter one in progress
def finish_stop():
    em.state("stopping", detail="saving a checkpoint")
    time.sleep({stop_s!r})
    if {stop_fails!r}:
        out.error("training", "Saving the final checkpoint failed: no space left on device.",
                  "Free some space; checkpoint_step_0000004 is intact.")
        sys.exit(1)
    out.error("cancelled", "Training stopped at step 7; saved checkpoint_step_0000007.", None)
    sys.exit(130)
signal.signal(signal.SIGTERM, term)
em.state("training", **({{"run": {run!r}}} if {run!r} else {{}}))
t0 = time.monotonic()
i = 0
while {forever!r} or i < {count}:
    if stop:
        finish_stop()
    values = {{"step": i, "loss/train": 5.0 / (1 + i * 1e-3), "lr": 2e-6,
               "perf/tokens_per_s": 1000.0 + i % 7, "memory/rss_gib": 1.0 + (i % 5) * 0.01}}
    if {gpu!r}:
        rank = i % {ranks!r}
        values.update({{"memory/device_used_gib": 20.0 + 5 * rank + (i % 11) * 0.1,
                       "memory/allocated_gib": 15.0 + 5 * rank, "memory/total_gib": 80.0}})
    em.metric(values, rank=i % {ranks!r}, split="train")
    if i % 100 == 0:
        em.progress("train", i, {count})
    i += 1
    if {forever!r}:
        time.sleep(0.001)
    elif {rate!r} and i % 20 == 0:
        # paced in bursts of 20, like ranks reporting together
        time.sleep(max(0.0, t0 + i / {rate!r} - time.monotonic()))
out.result({{"steps": i, "summary": "done"}})
"""
    return [sys.executable, "-c", code, "flood"]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie waiting to be reaped is not running
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def python_threads() -> set[str]:
    return {t.name for t in threading.enumerate()}
