"""A render's file name is the engine's (engine.layout.exports), not the window's."""

from __future__ import annotations

from pathlib import Path

from engine.layout.exports import new_render_path, renders_dir


def test_renders_made_in_one_second_get_their_own_names(tmp_path: Path) -> None:
    made = []
    for _ in range(3):
        out = new_render_path(tmp_path)
        out.write_bytes(b"")  # the render is written before the next one is named
        made.append(out)
    assert len(set(made)) == 3
    assert all(p.parent == renders_dir(tmp_path) and p.suffix == ".wav" for p in made)
    assert sorted(made, key=lambda p: p.stat().st_mtime_ns) == made
    assert new_render_path(tmp_path, ".flac").suffix == ".flac"
