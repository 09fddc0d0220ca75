"""Run a command as on a machine where some system libraries are not installed.

`run_without(sonames, cmd, ...)` runs `cmd` in a private mount namespace (`unshare
--mount`, root only; `can_hide` says whether this machine allows it) in which an empty
file is bound over each library's file, and a linker cache made without them is bound
over /etc/ld.so.cache. So the dynamic linker, `dlopen`, and `ctypes.util.find_library`
(which reads `ldconfig -p`) all fail to find them, as when the package is missing.
Nothing outside the namespace changes (`ldconfig -X` leaves the library links alone).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.helpers.sandbox import can_unshare


def library_file(soname: str) -> Path:
    """The file the linker cache gives for `soname` (symlinks resolved)."""
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                             check=True).stdout
    for line in listing.splitlines():
        name, _, target = line.strip().partition(" => ")
        if name.split(" ")[0] == soname and target:
            return Path(target).resolve()
    raise FileNotFoundError(f"{soname} is not installed here, so it cannot be hidden")


def can_hide() -> bool:
    return can_unshare() and shutil.which("ldconfig") is not None


def run_without(sonames: list[str], cmd: list[str], tmp: Path, env: dict[str, str],
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`cmd` (from the repository root) with `sonames` hidden; its output as text."""
    empty = tmp / "hidden-library"
    empty.write_bytes(b"")
    cache = tmp / "ld.so.cache"
    binds = "".join(f"mount --bind '{empty}' '{library_file(name)}'; " for name in sonames)
    script = (f"set -e; {binds}ldconfig -X -C '{cache}' 2>/dev/null; "
              f"mount --bind '{cache}' /etc/ld.so.cache; exec \"$@\"")
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
         *cmd], cwd=root, env={**os.environ, **env}, capture_output=True, text=True,
        timeout=timeout)
