"""The README's prepare section names every reason prepare leaves something out."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from engine.audio.checks import BLOCKING, WARNINGS

README = Path(__file__).resolve().parent.parent / "README.md"


def _prepare_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("- **prepare** makes")
    return text[start:text.index("- **train**", start)]


def test_readme_names_every_exclusion_reason() -> None:
    from engine.audio import io
    from engine.prepare import pipeline as prepare

    section = _prepare_section()
    named = set(re.findall(r"`([a-z_]+)`", section))
    assert BLOCKING <= named, sorted(BLOCKING - named)
    assert WARNINGS - {"minor_clipping", "dc_offset", "peak_limited", "text_estimated",
                       "denoised"} <= named
    # a whole take's reasons: the ones prepare sets itself and the decoder's
    take_codes = set(re.findall(r'"code": "([a-z_]+)"', Path(prepare.__file__).read_text()))
    for node in ast.walk(ast.parse(Path(io.__file__).read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "BadAudioFile"
                and len(node.args) > 1):
            take_codes |= {c.value for c in ast.walk(node.args[1])
                           if isinstance(c, ast.Constant) and isinstance(c.value, str)
                           and re.fullmatch(r"[a-z_]+", c.value)}
    assert {"silent", "non_finite", "excluded", "damaged"} <= take_codes
    assert take_codes <= named, sorted(take_codes - named)
