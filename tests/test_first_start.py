"""The first start on a fresh desktop: system libraries missing (issue 28, section 7).

Each test hides a real library from the dynamic linker (tests/helpers/hidden_libs.py: a
private mount namespace, root only) and starts the real program:
- without PortAudio, `voxshard --smoke-test` opens the window and says why there is no
  sound; the Record page cannot record, playback says the same sentence (this file run
  as a script inside the namespace drives that window);
- without libxcb-cursor on an X server (Xvfb, QT_QPA_PLATFORM=xcb), `voxshard` says in
  one sentence which library is missing and exits 1, instead of Qt's abort;
- without libEGL (which Qt's GUI library itself links), the `voxshard` command says the
  same kind of sentence instead of an ImportError from inside PySide6;
- `packaging/setup_venv.sh --check` prints exactly the missing libraries and the install
  line; with `--system-deps` (as root) it runs the package manager for them.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.core import syslibs
from tests.helpers.hidden_libs import can_hide, run_without

ROOT = Path(__file__).resolve().parents[1]
PORTAUDIO = "libportaudio.so.2"
XCB_CURSOR = "libxcb-cursor.so.0"
NO_SOUND = ("Recording and playback are off because libportaudio.so.2 is not installed; "
            "install it with: {line}.")

needs_namespace = pytest.mark.skipif(not can_hide(), reason="needs root, unshare and ldconfig "
                                     "(a private mount namespace hides the library)")


def _apt_line(packages: str) -> str:
    """The install line this test machine (Debian, apt-get) is told to run."""
    if syslibs.package_manager() != "apt-get":
        pytest.skip("the expected install lines are Debian's (apt-get)")
    return ("" if os.geteuid() == 0 else "sudo ") + f"apt-get install {packages}"


def _desktop_env(tmp_path: Path) -> dict[str, str]:
    # the user's settings and documents stay out of it
    return {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "XDG_DATA_HOME": str(tmp_path / "data"), "PYTHONPATH": str(ROOT),
            "QT_QPA_PLATFORM": "offscreen"}


@needs_namespace
def test_the_window_opens_without_portaudio_and_says_why(tmp_path: Path) -> None:
    sentence = NO_SOUND.format(line=_apt_line("libportaudio2"))
    smoke = run_without([PORTAUDIO], [sys.executable, "-m", "gui.app", "--smoke-test"],
                        tmp_path, _desktop_env(tmp_path))
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    assert "Traceback" not in smoke.stderr, smoke.stderr[-3000:]
    assert "Voxshard started: 9 pages" in smoke.stdout, smoke.stdout
    assert f"Sound: {sentence}" in smoke.stdout.splitlines(), smoke.stdout

    # the window itself, driven inside the same kind of namespace (this file as a script)
    out = tmp_path / "seen.json"
    drive = run_without([PORTAUDIO], [sys.executable, __file__, str(tmp_path / "ws"), str(out)],
                        tmp_path, _desktop_env(tmp_path))
    assert drive.returncode == 0, drive.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen["unavailable"] == sentence
    assert seen["status_bar_notice"] == sentence
    assert seen["record_page_says"] == sentence
    assert seen["record_enabled"] is False and seen["test_input_enabled"] is False
    assert seen["space_recorded"] is False and seen["after_space"] == sentence
    assert seen["play_started"] is False and seen["play_status"] == sentence
    assert seen["speak_play_error"].startswith(sentence)
    assert seen["about_portaudio"] == "not found"


@needs_namespace
def test_without_an_xcb_library_the_app_names_it_instead_of_aborting(xvfb: str,
                                                                     tmp_path: Path) -> None:
    env = {**_desktop_env(tmp_path), "DISPLAY": xvfb, "QT_QPA_PLATFORM": "xcb",
           "WAYLAND_DISPLAY": "", "XDG_SESSION_TYPE": "x11"}
    run = run_without([XCB_CURSOR], [sys.executable, "-m", "gui.app", "--smoke-test"],
                      tmp_path, env)
    line = _apt_line("libxcb-cursor0")
    assert run.returncode == 1, (run.returncode, run.stderr[-3000:])  # not Qt's abort (-6)
    assert run.stderr.splitlines() == [
        "error: The window cannot open on this X11 desktop because libxcb-cursor.so.0 is not "
        f"installed; install it with: {line}."], run.stderr[-3000:]
    assert "Voxshard started" not in run.stdout



@needs_namespace
def test_without_qts_own_libraries_the_command_names_them_instead_of_an_import_error(
        tmp_path: Path) -> None:
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts["voxshard"].split(":")
    run = run_without(["libEGL.so.1"], [sys.executable, "-m", module, "--smoke-test"],
                      tmp_path, _desktop_env(tmp_path))
    assert func == "main" and run.returncode == 1, (run.returncode, run.stderr[-3000:])
    assert run.stderr.splitlines() == [
        "error: The window cannot start because libEGL.so.1 is not installed; install it "
        f"with: {_apt_line('libegl1')}."], run.stderr[-3000:]
    # and with every library there, the same command starts the window
    ok = run_without([], [sys.executable, "-m", module, "--smoke-test"], tmp_path,
                     _desktop_env(tmp_path))
    assert ok.returncode == 0 and "Voxshard started" in ok.stdout, ok.stderr[-3000:]

@needs_namespace
def test_setup_check_prints_exactly_the_missing_libraries(tmp_path: Path) -> None:
    check = run_without([PORTAUDIO, XCB_CURSOR], ["bash", "packaging/setup_venv.sh", "--check"],
                        tmp_path, {})
    assert check.returncode == 1, check.stderr
    line = _apt_line("libportaudio2 libxcb-cursor0")
    assert check.stderr.splitlines() == [
        "Missing system libraries: libportaudio.so.2, libxcb-cursor.so.0 are not installed; "
        f"install them with: {line}"]
    # nothing hidden: nothing to say
    plain = run_without([], ["bash", "packaging/setup_venv.sh", "--check"], tmp_path, {})
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, "", "")


@needs_namespace
def test_setup_with_system_deps_installs_them_with_the_package_manager(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("--system-deps installs as root")
    _apt_line("")  # this machine's manager is apt-get
    # apt-get itself would change this machine: one that only notes what it was asked
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    asked = tmp_path / "asked.txt"
    fake = bin_dir / "apt-get"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> '{asked}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    run = run_without([PORTAUDIO], ["bash", "packaging/setup_venv.sh", "--system-deps",
                                    "--check"], tmp_path,
                      {"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert asked.read_text().splitlines() == ["update -qq", "install -y libportaudio2"]
    # the library is still hidden, so the set-up says it is still missing and fails
    assert run.returncode == 1
    assert "libportaudio.so.2 is not installed" in run.stderr


def test_each_package_manager_gets_its_own_line() -> None:
    by_name = {lib.soname: lib for lib in syslibs.LIBRARIES}
    libs = [by_name[PORTAUDIO], by_name[XCB_CURSOR], by_name["libxcb-shm.so.0"],
            by_name["libxcb-xkb.so.1"]]
    sudo = "" if os.geteuid() == 0 else "sudo "
    lines = {m: syslibs.install_line(libs, m) for m in syslibs.MANAGERS}
    assert lines == {
        "apt-get": f"{sudo}apt-get install libportaudio2 libxcb-cursor0 libxcb-shm0 libxcb-xkb1",
        "dnf": f"{sudo}dnf install portaudio xcb-util-cursor libxcb",
        "zypper": f"{sudo}zypper install libportaudio2 libxcb-cursor0 libxcb-shm0 libxcb-xkb1",
        "pacman": f"{sudo}pacman -S --needed portaudio xcb-util-cursor libxcb"}
    assert syslibs.package_manager(lambda m: "/usr/bin/zypper" if m == "zypper" else None) \
        == "zypper"
    assert syslibs.package_manager(lambda m: None) is None
    assert syslibs.describe(libs[:1], None) == (
        "libportaudio.so.2 is not installed; install the package that provides it with your "
        "system's package manager")


def _drive_the_window(workspace: Path, out: Path) -> None:
    """Inside the namespace: open the window on a voice and try to record and play."""
    from PySide6.QtCore import QSettings, Qt
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication

    from engine.audio import sound
    from engine.core.errors import SynthesisError
    from engine.synth.stream import Player
    from gui.app import MainWindow, versions
    from gui.context import AppContext
    from gui.pages.record import RecordPage
    from tests.helpers.voices import make_voice

    _app = QApplication([sys.argv[0]])  # the window needs one to exist
    workspace.mkdir(parents=True)
    settings = QSettings(str(workspace.parent / "voxshard.ini"), QSettings.Format.IniFormat)
    settings.setValue("workspace", str(workspace))
    window = MainWindow(AppContext(settings))
    window.show()
    window.ctx.set_voice(make_voice(workspace))
    page = window.show_page(RecordPage)
    assert isinstance(page, RecordPage)
    while page.prompt is None:  # the reader's snapshot of the voice
        QTest.qWait(20)
    seen: dict[str, object] = {
        "unavailable": sound.unavailable(),
        "status_bar_notice": window.sound_notice.text() if window.sound_notice else None,
        "record_page_says": page.rec_state.text(),
        "record_enabled": page.rec_btn.isEnabled(),
        "test_input_enabled": page.test_btn.isEnabled(),
        "about_portaudio": dict(versions())["PortAudio"]}
    QTest.keyClick(window, Qt.Key.Key_Space)  # the page's record key works wherever focus is
    QTest.qWait(50)
    seen["space_recorded"] = page.recorder.active
    seen["after_space"] = page.rec_state.text()
    seen["play_started"] = window.ctx.player.play(np.zeros(2400, dtype=np.float32), 24000)
    seen["play_status"] = window.statusBar().currentMessage()
    try:
        Player()
        seen["speak_play_error"] = None
    except SynthesisError as exc:  # `speak --play`: what the CLI prints
        seen["speak_play_error"] = str(exc)
    out.write_text(json.dumps(seen))
    window.shutdown()


if __name__ == "__main__":
    _drive_the_window(Path(sys.argv[1]), Path(sys.argv[2]))
