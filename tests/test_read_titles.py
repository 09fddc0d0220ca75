"""Chapter titles spoken (issue 52): each chapter of an EPUB opens on its title, a take of
its own said by the narrator, then a pause; a text script's headings only when asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config.read import ReadRequest
from engine.read.project import make_plan
from tests.helpers.reading import SHORT, read_events, read_workspace, tides_epub, tiny_request


@pytest.fixture(scope="module")
def workspace(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return read_workspace(tmp_path_factory.mktemp("titles") / "ws", tiny_model_dir)


def _said(request: ReadRequest) -> list[tuple[int, str, bool]]:
    return [(p.number, p.line.text, p.line.title) for p in make_plan(request).lines]


def test_an_epubs_titles_are_lines_unless_asked_not_and_a_texts_only_when_asked(
        workspace: Path, tmp_path: Path) -> None:
    book = tiny_request(script=str(tides_epub(tmp_path / "tides.epub")), workspace=str(workspace),
                        voice="ada")
    assert _said(book) == [(1, "Ebb", True), (2, "The sea went out.", False),
                           (3, "Flow", True), (4, "The sea came back.", False)]
    plan = make_plan(book)
    assert plan.lines[0].voice.name == "ada" and plan.lines[0].line.pause_s == 1.5
    assert [c.title for c in plan.script.chapters] == ["Ebb", "Flow"]
    assert _said(book.replace(chapter_titles=False)) == [
        (1, "The sea went out.", False), (2, "The sea came back.", False)]

    text = tmp_path / "notes.md"
    text.write_text("Before any heading.\n\n# Storm\n\nThe wind rose.\n", encoding="utf-8")
    notes = tiny_request(script=str(text), workspace=str(workspace), voice="ada")
    assert _said(notes) == [(1, "Before any heading.", False), (2, "The wind rose.", False)]
    # asked: the heading is said; the chapter the text opens without one has no title
    assert _said(notes.replace(chapter_titles=True)) == [
        (1, "Before any heading.", False), (2, "Storm", True), (3, "The wind rose.", False)]


def test_a_spoken_title_is_its_own_take_followed_by_its_pause(workspace: Path,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "tides.wav"
    request = tiny_request(script=str(tides_epub(tmp_path / "tides.epub")), out=str(out),
                           workspace=str(workspace), voice="ada", max_frames=SHORT,
                           title_pause_s=2.5)
    result, _ = read_events(request)
    assert (result["lines"], result["rendered"], result["chapters"]) == (4, 4, 2)
    plan = make_plan(request)
    assert plan.lines[0].record(plan.project, 1)["text"] == "Ebb"
    cues = [block.splitlines() for block in
            out.with_suffix(".srt").read_text(encoding="utf-8").strip().split("\n\n")]
    assert [c[2] for c in cues] == ["Ebb", "The sea went out.", "Flow", "The sea came back."]

    def seconds(stamp: str) -> float:
        h, m, rest = stamp.split(":")
        return int(h) * 3600 + int(m) * 60 + float(rest.replace(",", "."))

    title_end = seconds(cues[0][1].split(" --> ")[1])
    first_start = seconds(cues[1][1].split(" --> ")[0])
    assert first_start - title_end == pytest.approx(2.5, abs=0.002)
    # the second chapter opens on room tone, then its title
    chapter_two = next(c["start_s"] for c in result["export"]["chapters"] if c["title"] == "Flow")
    assert seconds(cues[2][1].split(" --> ")[0]) == pytest.approx(
        chapter_two + request.head_s, abs=0.002)
