"""The repository's packages for a bench script run as a file (`python bench/x.py`), where
Python puts bench/ itself first on the path; `python -m bench.x` needs none of this.

Each script imports it before its own imports, when it has no package.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
