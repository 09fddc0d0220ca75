"""Run a Python command as on a machine where Ray is not installed.

The lent GPU machine has no Ray unless the device kit brings it, so both GPU proofs must
reach their tables without it. `without_ray_env(tmp)` gives an environment whose
PYTHONPATH starts with a folder holding a `sitecustomize` that refuses every `ray`
import exactly as a missing package does (`ModuleNotFoundError` naming `ray`); every
child process the command starts (torch.distributed's workers, the proof's
configurations) inherits it. Nothing is installed or removed.
"""

from __future__ import annotations

import os
from pathlib import Path

_BLOCKER = '''\
import sys


class _NoRay:
    """Ray is absent: `import ray` (or any submodule) fails as for a missing package."""

    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoRay())
'''


def without_ray_env(tmp: Path) -> dict[str, str]:
    """os.environ with Ray made unimportable in this command and its children."""
    folder = tmp / "no-ray"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_BLOCKER)
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join(p for p in (str(folder), str(root), os.environ.get("PYTHONPATH"))
                           if p)
    return {**os.environ, "PYTHONPATH": path}
