"""Typed errors of the engine.

Every error the engine raises on purpose is a `VoxshardError`: a one-sentence
message a person can act on, plus an optional hint that says what to do.
The CLI prints these without a traceback; anything else is a bug.

A hint speaks to a terminal (flags, commands). Where the window offers the same
remedy as a button or a field, `window_hint` says it in those words; the JSON error
event carries both, and the window shows `window_hint` when there is one.
"""

from __future__ import annotations


class VoxshardError(Exception):
    """Base of all deliberate engine errors."""

    #: stable, machine-readable category for the JSON event stream
    code = "error"

    def __init__(self, message: str, hint: str | None = None, *,
                 window_hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        #: the hint in the window's words (buttons and fields, not flags); None: `hint`
        self.window_hint = window_hint

    def __str__(self) -> str:
        return f"{self.message} {self.hint}" if self.hint else self.message


class InputError(VoxshardError):
    """A command was given an argument that cannot work (bad path, bad value)."""

    code = "input"


class WorkspaceError(VoxshardError):
    """The voice folder is missing, damaged, or cannot be written."""

    code = "workspace"


class AudioError(VoxshardError):
    """An audio file cannot be read or is unusable."""

    code = "audio"


class DeviceError(VoxshardError):
    """No usable sound device, or the chosen one failed."""

    code = "device"


class ModelError(VoxshardError):
    """A model cannot be found, downloaded, loaded, or is not Qwen3-TTS."""

    code = "model"


class TrainingError(VoxshardError):
    """A training run cannot start or failed for good."""

    code = "training"


class ClusterError(VoxshardError):
    """The Ray cluster cannot be started or reached."""

    code = "cluster"


class SynthesisError(VoxshardError):
    """Speech could not be generated."""

    code = "synthesis"


class DiskFullError(VoxshardError):
    """Not enough free disk space to write the result."""

    code = "disk_full"


class Cancelled(VoxshardError):
    """The user asked to stop. Not a failure: callers report it quietly."""

    code = "cancelled"

    def __init__(self, message: str = "Cancelled.", hint: str | None = None) -> None:
        super().__init__(message, hint)
