"""Whether a process is still running, by its id (no handle to it needed)."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """True while process `pid` runs (one of another user's counts as running; one that
    has ended and waits for its parent to reap it does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # Linux: a zombie is listed with state Z
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().split(") ", 1)[1][:1] != "Z"
    except IndexError:
        return True
    except OSError:  # gone since the signal (Linux), or no /proc: the signal's answer
        return not os.path.isdir("/proc/self")
