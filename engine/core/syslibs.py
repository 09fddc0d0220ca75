"""The system libraries Voxshard loads that pip cannot install, and the line that installs them.

One table: each library's file name, what needs it, and its package for each package
manager. Standard library only, because `packaging/setup_venv.sh` runs it with the
system Python before the virtual environment exists:

    python3 -m engine.core.syslibs            # print the missing ones and the install line
    python3 -m engine.core.syslibs --install  # as root: install them with the package manager

The window asks it too: for the sentence shown when PortAudio is missing
(`engine.audio.sound`) and, before Qt loads its xcb platform plugin, for the
xcb libraries (Qt would otherwise abort with a list of plugins).

A library counts as present when the dynamic linker can load it by its file name,
exactly as PortAudio's and Qt's own loading does.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

SOUND = "sound"  # PortAudio: recording and playback
QT = "qt"  # what Qt's GUI library itself links (every platform, offscreen included)
XCB = "xcb"  # Qt's xcb platform plugin (an X11 desktop)

#: the package managers we know, in the order they are looked for
MANAGERS = ("apt-get", "dnf", "zypper", "pacman")


@dataclass(frozen=True)
class Library:
    soname: str
    group: str
    apt: str  # Debian, Ubuntu
    dnf: str  # Fedora, RHEL
    zypper: str  # openSUSE
    pacman: str  # Arch

    def package(self, manager: str) -> str:
        return getattr(self, manager.replace("-get", ""))


def _lib(soname: str, group: str, apt: str, dnf: str, zypper: str | None = None,
         pacman: str | None = None) -> Library:
    # openSUSE names shared-library packages as Debian does; Arch mostly as Fedora
    return Library(soname, group, apt, dnf, zypper or apt, pacman or dnf)


_XCB_CORE = "libxcb"  # Fedora and Arch ship these extensions in libxcb itself
LIBRARIES: tuple[Library, ...] = (
    _lib("libportaudio.so.2", SOUND, "libportaudio2", "portaudio", pacman="portaudio"),
    _lib("libEGL.so.1", QT, "libegl1", "libglvnd-egl", "libEGL1", "libglvnd"),
    _lib("libGL.so.1", QT, "libgl1", "libglvnd-glx", "libGL1", "libglvnd"),
    _lib("libfontconfig.so.1", QT, "libfontconfig1", "fontconfig"),
    _lib("libxkbcommon.so.0", QT, "libxkbcommon0", "libxkbcommon"),
    _lib("libglib-2.0.so.0", QT, "libglib2.0-0", "glib2", "libglib-2_0-0"),
    _lib("libdbus-1.so.3", QT, "libdbus-1-3", "dbus-libs", pacman="dbus"),
    _lib("libX11-xcb.so.1", XCB, "libx11-xcb1", "libX11-xcb", "libX11-xcb1", "libx11"),
    _lib("libxkbcommon-x11.so.0", XCB, "libxkbcommon-x11-0", "libxkbcommon-x11"),
    _lib("libxcb.so.1", XCB, "libxcb1", _XCB_CORE),
    _lib("libxcb-cursor.so.0", XCB, "libxcb-cursor0", "xcb-util-cursor"),
    _lib("libxcb-icccm.so.4", XCB, "libxcb-icccm4", "xcb-util-wm"),
    _lib("libxcb-image.so.0", XCB, "libxcb-image0", "xcb-util-image"),
    _lib("libxcb-keysyms.so.1", XCB, "libxcb-keysyms1", "xcb-util-keysyms"),
    _lib("libxcb-render-util.so.0", XCB, "libxcb-render-util0", "xcb-util-renderutil"),
    _lib("libxcb-util.so.1", XCB, "libxcb-util1", "xcb-util"),
    _lib("libxcb-randr.so.0", XCB, "libxcb-randr0", _XCB_CORE),
    _lib("libxcb-render.so.0", XCB, "libxcb-render0", _XCB_CORE),
    _lib("libxcb-shape.so.0", XCB, "libxcb-shape0", _XCB_CORE),
    _lib("libxcb-shm.so.0", XCB, "libxcb-shm0", _XCB_CORE),
    _lib("libxcb-sync.so.1", XCB, "libxcb-sync1", _XCB_CORE),
    _lib("libxcb-xfixes.so.0", XCB, "libxcb-xfixes0", _XCB_CORE),
    _lib("libxcb-xkb.so.1", XCB, "libxcb-xkb1", _XCB_CORE),
)
_SONAMES = {lib.soname for lib in LIBRARIES}


def _loads(soname: str) -> bool:
    """The dynamic linker finds `soname` and every library it needs that is not in the table.

    A library whose own dependency from the table is missing still counts as present:
    that dependency is reported on its own, so the install line names the real gap.
    """
    try:
        ctypes.CDLL(soname)
    except OSError as exc:
        failed = os.path.basename(str(exc).split(":", 1)[0])
        return failed != soname and failed in _SONAMES
    return True


def missing(groups: Iterable[str] = (SOUND, QT, XCB)) -> list[Library]:
    """The libraries of `groups` that this machine cannot load, in table order."""
    wanted = set(groups)
    if not sys.platform.startswith("linux"):
        return []  # the bundles for other systems carry their own copies
    return [lib for lib in LIBRARIES if lib.group in wanted and not _loads(lib.soname)]


def package_manager(which: Callable[[str], str | None] = shutil.which) -> str | None:
    """The first package manager of MANAGERS on PATH, or None."""
    return next((m for m in MANAGERS if which(m)), None)


def packages(libs: Iterable[Library], manager: str) -> list[str]:
    """The packages that hold `libs` for `manager`, each once, in table order."""
    return list(dict.fromkeys(lib.package(manager) for lib in libs))


def install_command(libs: Iterable[Library], manager: str, confirm: bool = False) -> list[str]:
    """The command (run as root) that installs `libs` with `manager`; without `confirm`
    it does not stop to ask (the set-up's own install)."""
    names = packages(libs, manager)
    if manager == "pacman":
        return ["pacman", "-S", "--needed", *([] if confirm else ["--noconfirm"]), *names]
    return [manager, "install", *([] if confirm else ["-y"]), *names]


def install_line(libs: Iterable[Library], manager: str | None) -> str | None:
    """The one line a person types to install `libs` (with sudo unless already root);
    None without a known package manager."""
    if manager is None:
        return None
    sudo = "" if os.geteuid() == 0 else "sudo "
    return sudo + " ".join(install_command(libs, manager, confirm=True))


def describe(libs: list[Library], manager: str | None) -> str:
    """One sentence: which libraries are missing and the line that installs them."""
    names = ", ".join(lib.soname for lib in libs)
    one = len(libs) == 1
    line = install_line(libs, manager)
    how = (f"install {'it' if one else 'them'} with: {line}" if line else
           f"install the package{'' if one else 's'} that provide{'s' if one else ''} "
           f"{'it' if one else 'them'} with your system's package manager")
    return f"{names} {'is' if one else 'are'} not installed; {how}"


def install(libs: list[Library], manager: str) -> int:
    """Install `libs` with `manager` (as root); the package manager's exit status."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if manager == "apt-get":  # a fresh machine's package lists may be empty or stale
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
    return subprocess.run(install_command(libs, manager), env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    """Print what is missing (exit 1) or nothing (exit 0); `--install` installs it first."""
    args = list(sys.argv[1:] if argv is None else argv)
    gone = missing()
    if not gone:
        return 0
    manager = package_manager()
    if "--install" in args:
        if os.geteuid() != 0:
            print("Installing system libraries needs root: run it with sudo.", file=sys.stderr)
            return 2
        if manager is None:
            print(f"No known package manager was found: {describe(gone, None)}.", file=sys.stderr)
            return 1
        install(gone, manager)
        gone = missing()
        if not gone:
            print("The system libraries Voxshard needs are installed.")
            return 0
    print(f"Missing system libraries: {describe(gone, manager)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
