"""A real X server for the tests that need one: `xvfb`, a fresh 1600x1000 Xvfb display, and
`laptop_xvfb`, a 1100x760 one (plugin fixtures, registered in tests/conftest.py).

Qt's offscreen platform skips the window system; these tests start the app (or a
wheel, a click) through Qt's xcb platform on Xvfb. Needs Xvfb and xwininfo
(x11-utils); `.ci/run` installs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def start_xvfb(size: str = "1600x1000") -> Iterator[str]:
    """Start Xvfb with one screen of `size` (WIDTHxHEIGHT); yields its DISPLAY, then stops it."""
    if not shutil.which("Xvfb") or not shutil.which("xwininfo"):
        pytest.skip("Xvfb or xwininfo is missing (apt-get install xvfb x11-utils)")
    # Xvfb picks a free display itself and writes its number to the pipe: two pytest
    # processes side by side (packaging/run_tests.sh) never race for one number
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(["Xvfb", "-displayfd", str(write_fd), "-screen", "0",
                             f"{size}x24", "-nolisten", "tcp"], pass_fds=(write_fd,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        number = pipe.readline().strip()  # empty when Xvfb exits first
    if not number:
        proc.kill()
        pytest.fail(f"Xvfb did not start: {proc.communicate(timeout=10)[1].decode()[-500:]}")
    display = f":{number}"
    deadline = time.monotonic() + 30
    while subprocess.run(["xwininfo", "-root", "-display", display], capture_output=True,
                         timeout=10).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"Xvfb did not answer on {display}")
        time.sleep(0.1)
    yield display
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def xvfb() -> Iterator[str]:
    """The DISPLAY of a new 1600x1000 Xvfb server, stopped after the test."""
    yield from start_xvfb("1600x1000")


@pytest.fixture
def laptop_xvfb() -> Iterator[str]:
    """The DISPLAY of a new Xvfb server with a laptop's 1100x760 screen (issue 28)."""
    yield from start_xvfb("1100x760")


def run_on_display(script: str, display: str, home: Path, *args: str) -> None:
    """Run a test's window side (`script`, with `args`) in its own process on `display`,
    through Qt's xcb platform, with `home` as its home; fails the test if it fails."""
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env.update(DISPLAY=display, QT_QPA_PLATFORM="xcb", HOME=str(home),
               XDG_CONFIG_HOME=str(home / "config"), PYTHONPATH=str(ROOT))
    child = subprocess.run([sys.executable, script, *args], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
