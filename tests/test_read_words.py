"""Is every take saying its line? The word check of `read` (issue 52): each take
transcribed by the offline recogniser and scored against its part's text (a line is
said in parts, sentence groups, each a take).

The tiny model says no words, so a take of real speech is piper's 'joe' saying a line,
put where the project keeps that line's take; the word check of a later read scores it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from engine.layout import reading
from engine.quality.said import WRONG_WORDS, WordCheck
from engine.read.project import make_plan
from tests.helpers.reading import (
    OTHER,
    RIGHT,
    SHORT,
    read_events,
    read_workspace,
    say_take,
    tiny_request,
)


@pytest.fixture(scope="module")
def workspace(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return read_workspace(tmp_path_factory.mktemp("words") / "ws", tiny_model_dir)


def test_a_take_of_its_line_passes_and_a_take_of_another_line_is_flagged(
        workspace: Path, tmp_path: Path,
        piper_synth: Callable[[str], tuple[np.ndarray, int]]) -> None:
    script = tmp_path / "train.txt"
    script.write_text(f"{RIGHT}\n\n{OTHER}\n", encoding="utf-8")
    request = tiny_request(script=str(script), workspace=str(workspace), voice="ada",
                           max_frames=SHORT, retries=0)
    first, _ = read_events(request)
    plan = make_plan(request)
    # line 1's take says line 1; line 2's take says line 1 too (a fluent, wrong take)
    for planned in plan.lines:
        say_take(reading.take_audio(plan.project, planned.key, 1), RIGHT, piper_synth)

    checked, events = read_events(request.replace(word_check=True))
    assert checked["rendered"] == 0 and checked["flagged"] == [2]
    assert "lines 2 flagged" in checked["summary"]
    right, wrong = (plan.line(n).record(plan.project, 1) for n in (1, 2))
    assert right["wer"] < 0.3 and right["problems"] == [], right
    assert wrong["wer"] > 0.7 and wrong["problems"] == [WRONG_WORDS], wrong
    assert "delayed" in right["heard"] and "delayed" in wrong["heard"]
    scored = [e.data["line"] for e in events if e.kind == "progress"
              and e.data.get("stage") == "words"]
    assert scored == [1, 2]
    # scored once: a later read does not transcribe them again
    _, later = read_events(request.replace(word_check=True))
    assert not [e for e in later if e.kind == "progress" and e.data.get("stage") == "words"]
    assert first["flagged"] == []  # unchecked, the same takes were not flagged


def test_a_take_that_says_no_words_is_retried_with_another_seed_then_flagged(
        workspace: Path, tmp_path: Path) -> None:
    """The tiny model's take of a line says none of it: scored as it is finished, retried
    with the next seed, and the line flagged when every take fails."""
    script = tmp_path / "mute.txt"
    script.write_text("The lamp was lit at dusk.\n", encoding="utf-8")
    request = tiny_request(script=str(script), workspace=str(workspace), voice="ada",
                           max_frames=SHORT, retries=1, word_check=True, asr="pocketsphinx")
    result, events = read_events(request)
    assert result["flagged"] == [1] and result["rendered"] == 1
    plan = make_plan(request)
    takes = [plan.line(1).record(plan.project, seed) for seed in plan.line(1).seeds]
    assert [t["seed"] for t in takes] == [1, 2]
    assert all(WRONG_WORDS in t["problems"] and t["wer"] > 0.7 for t in takes), takes
    retried = [e for e in events if e.kind == "log" and e.data.get("retry_seed") == 2]
    assert retried and WRONG_WORDS in retried[0].data["problems"]


def test_a_language_the_recogniser_cannot_hear_is_said_once_not_flagged(
        piper_synth: Callable[[str], tuple[np.ndarray, int]]) -> None:
    check = WordCheck("pocketsphinx")
    audio, rate = piper_synth(RIGHT)
    assert check.score(audio, rate, "Unser Zug hatte Verspätung.", "german") is None
    assert "English only" in (check.why_not("german") or "")
    said = check.score(audio, rate, RIGHT, "english")
    assert said is not None and said.wer < 0.3 and check.why_not("english") is None
    wrong = check.score(audio, rate, OTHER, "english")
    assert wrong is not None and wrong.wer > 0.7


def test_the_threshold_is_a_setting_of_the_project(tmp_path: Path) -> None:
    from engine.config.read import ReadRequest
    from engine.core.errors import InputError

    request = ReadRequest(script=str(tmp_path / "s.txt"))
    assert request.word_check and request.wer_max == 0.7
    with pytest.raises(InputError, match="wer_max"):
        ReadRequest(script="s.txt", wer_max=0.0)


def test_each_part_of_a_line_is_scored_against_its_own_words(
        workspace: Path, tmp_path: Path,
        piper_synth: Callable[[str], tuple[np.ndarray, int]]) -> None:
    """A line of two sentences is two takes: each scored against its part's words, and
    the part whose take says other words flags the line alone."""
    script = tmp_path / "two.txt"
    script.write_text(f"{RIGHT} {OTHER}\n", encoding="utf-8")
    request = tiny_request(script=str(script), workspace=str(workspace), voice="ada",
                           max_frames=SHORT, retries=0, chunk_chars=80)
    read_events(request)
    plan = make_plan(request)
    first, second = plan.line(1).parts
    assert (first.text, second.text) == (RIGHT, OTHER)
    for part in (first, second):  # both say the first sentence: part 2's is wrong
        say_take(reading.take_audio(plan.project, part.key, 1), RIGHT, piper_synth)

    checked, events = read_events(request.replace(word_check=True))
    assert checked["rendered"] == 0 and checked["flagged"] == [1]
    right, wrong = (part.record(plan.project, 1) for part in (first, second))
    assert right["wer"] < 0.3 and right["problems"] == [], right
    assert wrong["wer"] > 0.7 and wrong["problems"] == [WRONG_WORDS], wrong
    scored = [(e.data["line"], e.data["part"]) for e in events if e.kind == "progress"
              and e.data.get("stage") == "words"]
    assert scored == [(1, 1), (1, 2)]
