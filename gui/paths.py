"""Where the app finds its assets, from a checkout, an install, or a frozen bundle."""

from __future__ import annotations

import sys
from pathlib import Path


def assets_dir() -> Path:
    frozen_root = getattr(sys, "_MEIPASS", None)
    if frozen_root:
        return Path(frozen_root) / "assets"
    return Path(__file__).resolve().parent.parent / "assets"


def icon_path(name: str) -> Path:
    return assets_dir() / "icons" / f"{name}.svg"


def style_path(name: str = "voxshard.qss") -> Path:
    return assets_dir() / "style" / name
