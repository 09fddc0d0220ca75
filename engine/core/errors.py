"""Typed errors of the engine.

Every error the engine raises on purpose is a `VoxshardError`: a one-sentence
message a person can act on, plus an optional hint that says what to do.
The CLI prints these without a traceback; anything else is a bug.

An error that names a setting writes its path in braces, "{model.predictor_frames}",
never a flag or a label: the remedy is data (`settings`), and each surface words it
(`worded`): the CLI as the flag, the window as the field's label, the Python API as the
keyword (the default). A remedy that sets settings to values is `changes`, data each
surface says its way (`engine.config.change`): the CLI as flags, the window as buttons
that set its fields. A hint that speaks to a terminal in other ways (commands) may have
`window_hint`, the same remedy in the window's words; the JSON error event carries
both, and the window shows `window_hint` when there is one.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Callable, Iterable
from typing import Any

#: "{section.field}": a setting named in an error's text (engine.config.schema)
_SETTING = re.compile(r"\{([a-z_]+\.[a-z_]+)\}")


def keyword_words(path: str) -> str:
    """A setting as the Python API names it: its keyword (`predictor_frames`)."""
    return path.rpartition(".")[2]


class VoxshardError(Exception):
    """Base of all deliberate engine errors."""

    #: stable, machine-readable category for the JSON event stream
    code = "error"

    def __init__(self, message: str, hint: str | None = None, *,
                 window_hint: str | None = None, changes: Iterable[Any] = ()) -> None:
        #: the texts as written, "{section.field}" standing for a setting
        self.template = message
        self.hint_template = hint
        #: the remedy as settings to change (`engine.config.change.Change`s), which each
        #: surface says its way: the CLI as flags, the window as buttons, here as keywords
        self.changes = tuple(changes)
        self.message, self.hint = self.worded(keyword_words)
        if self.changes:
            self.hint = " ".join([*([self.hint] if self.hint else []), *(
                f"{c.why} ({keyword_words(c.path)}={c.value!r})." for c in self.changes)])
        super().__init__(self.message)
        #: the hint in the window's words (buttons and fields, not flags); None: `hint`
        self.window_hint = window_hint

    @property
    def settings(self) -> list[str]:
        """The settings ("model.predictor_frames") the message and hint name: the remedy."""
        return list(dict.fromkeys(_SETTING.findall(f"{self.template} "
                                                   f"{self.hint_template or ''}")))

    def worded(self, words: Callable[[str], str]) -> tuple[str, str | None]:
        """Message and hint with each setting named by `words(path)`."""
        def say(text: str) -> str:
            return _SETTING.sub(lambda m: words(m.group(1)), text)

        return say(self.template), None if self.hint_template is None else say(
            self.hint_template)

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


#: what Ray's memory monitor says of each process it kills for the host's memory (its
#: `ray.exceptions.OutOfMemoryError`)
RAY_OOM_TEXT = "killed due to the node running low on memory"


def is_device_out_of_memory(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error behind it, is a GPU (or other accelerator) running out
    of memory: torch's `OutOfMemoryError` (by name: no torch import here) or the text
    the device's runtime writes. Ray's own "OutOfMemoryError" is the host's memory
    monitor killing a process, not a device: it is left out."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc)
        if type(exc).__name__ == "OutOfMemoryError" and RAY_OOM_TEXT not in text:
            return True
        if any(m in text for m in ("CUDA out of memory", "CUDA error: out of memory",
                                   "MPS backend out of memory", "XPU out of memory")):
            return True
        base = getattr(exc, "_base_exc", None)  # a Ray task's error keeps the original here
        exc = base if isinstance(base, BaseException) else (exc.__cause__ or exc.__context__)
    return False


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error behind it, is the disk or the user's quota running out:
    an `OSError`'s errno, the text a library put in its own error, and the per-rank
    failures of a distributed checkpoint's `CheckpointException`."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc] if exc is not None else []
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e) or "Disk quota exceeded" in str(e):
            return True
        stack += [x for x in (e.__cause__, e.__context__) if x is not None]
        failures = getattr(e, "failures", None)  # {rank: exception or (exception, trace)}
        if isinstance(failures, dict):
            for x in failures.values():
                x = x[0] if isinstance(x, tuple) and x else x
                if isinstance(x, BaseException):
                    stack.append(x)
    return False


class Cancelled(VoxshardError):
    """The user asked to stop. Not a failure: callers report it quietly."""

    code = "cancelled"

    def __init__(self, message: str = "Cancelled.", hint: str | None = None) -> None:
        super().__init__(message, hint)
