"""The Voices page says what a voice speaks with: each tier, its size and its base
(issue 30), read through the real catalog as the window's reader delivers it."""

from __future__ import annotations

from pathlib import Path

from engine.prepare.instant import make_instant_voice
from gui.pages.voices import VoicesPage
from tests.helpers.voices import copy_voice


def test_voices_page_shows_the_instant_tier_with_size_and_base(
        qtbot, ctx, workspace: Path, prepared_voice: Path, tiny_model_dir: Path) -> None:
    voice = copy_voice(prepared_voice, workspace / "joe")
    page = VoicesPage(ctx)
    qtbot.addWidget(page)
    page.select(voice)
    page.refresh()
    qtbot.waitUntil(lambda: "nothing yet" in page.tiers.text(), timeout=10000)
    make_instant_voice(voice, str(tiny_model_dir))
    page.refresh()  # the reader sees the voice folder change and reads it again
    qtbot.waitUntil(lambda: "instant:" in page.tiers.text(), timeout=10000)
    text = page.tiers.text()
    assert " MB, on tiny-base" in text and "nothing yet" not in text
