"""The sound device: the one place that imports sounddevice, and why there is no sound.

sounddevice loads the system's PortAudio when it is imported and raises OSError when
the library is missing; importing it at the top of a module would stop the window (and
the CLI's `speak --play`) before anything shows. Everything that records or plays asks
here instead: `sounddevice()` gives the module or raises `DeviceError` with one
sentence saying what to install, `unavailable()` gives that sentence or None, and
`sd` stands for the module in code that uses it in many places (imported at its
first use).
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from engine.core import syslibs
from engine.core.errors import DeviceError


@functools.cache
def _load() -> tuple[ModuleType | None, str | None]:
    # a function-level import: PortAudio may be missing, and that must not stop an import
    try:
        import sounddevice  # noqa: PLC0415
    except ImportError:  # a bundle or venv made without it
        return None, ("Recording and playback are off because the Python package sounddevice "
                      "is not installed; run: bash packaging/setup_venv.sh.")
    except OSError:  # PortAudio did not load
        gone = syslibs.missing([syslibs.SOUND]) or [
            lib for lib in syslibs.LIBRARIES if lib.group == syslibs.SOUND]
        why = syslibs.describe(gone, syslibs.package_manager())
        return None, f"Recording and playback are off because {why}."
    return sounddevice, None


def unavailable() -> str | None:
    """Why nothing can be recorded or played here (one sentence), or None."""
    return _load()[1]


def sounddevice() -> ModuleType:
    """The sounddevice module; `DeviceError` (what to install) when PortAudio is missing."""
    sd, why = _load()
    if sd is None:
        raise DeviceError(why or "No sound device library is available.")
    return sd


class _Sounddevice:
    """sounddevice, imported when an attribute is first read (`DeviceError` without PortAudio)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(sounddevice(), name)


sd = _Sounddevice()
