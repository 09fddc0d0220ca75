"""A take is a sentence group, not a whole line (issue 52): a line is said in parts (the
synthesizer's chunks), each its own take, retried, regenerated and picked alone; the
export joins a line's parts with the synthesizer's pause between chunks; a project whose
lines were rendered whole keeps those takes.

On the tiny model (tests/helpers/reading.py), short takes (`SHORT` frames a part)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from engine.audio.timebase import SAMPLE_RATE
from engine.config.read import ReadRequest
from engine.core.atomic import write_json
from engine.core.errors import InputError
from engine.layout import reading
from engine.read.project import flagged_lines, line_parts, make_plan, take_key
from tests.helpers.cli_events import cli_ends
from tests.helpers.reading import SHORT, read_events, read_workspace, tiny_request

#: three sentences, each a part at 40 characters a chunk
PARAGRAPH = ("The lamp was lit at dusk. The bay was calm all night. "
             "Nobody spoke until the morning came.")
SCRIPT = f"{PARAGRAPH}\n\nYes.\n"
CHUNK = 40


@pytest.fixture(scope="module")
def workspace(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return read_workspace(tmp_path_factory.mktemp("parts") / "ws", tiny_model_dir)


def _request(workspace: Path, folder: Path, **fields: Any) -> ReadRequest:
    script = folder / "night.txt"
    script.write_text(SCRIPT, encoding="utf-8")
    return tiny_request(script=str(script), workspace=str(workspace), voice="ada",
                        max_frames=SHORT, chunk_chars=CHUNK, retries=0, **fields)


def _seeds(request: ReadRequest) -> list[list[int]]:
    """Each part's seeds, line 1's parts then line 2's."""
    plan = make_plan(request)
    return [part.seeds for planned in plan.lines for part in planned.parts]


def test_a_paragraph_is_said_in_parts_and_exported_as_their_join(
        workspace: Path, tmp_path: Path) -> None:
    request = _request(workspace, tmp_path, out=str(tmp_path / "night.wav"),
                       loudness_lufs=None, room_tone_db=None, peak_dbfs=0.0)
    result, events = read_events(request)
    plan = make_plan(request)
    first = plan.line(1)
    assert [p.text for p in first.parts] == [
        "The lamp was lit at dusk.", "The bay was calm all night.",
        "Nobody spoke until the morning came."]
    assert [p.text for p in plan.line(2).parts] == ["Yes."]
    assert _seeds(request) == [[1], [1], [1], [1]]
    assert len({p.key for p in first.parts}) == 3
    # progress counts takes (parts), each naming its line and part
    render = [e.data for e in events if e.kind == "progress" and e.data["stage"] == "render"
              and not e.data.get("loading")]
    assert [e["done"] for e in render] == [1, 2, 3, 4] and render[-1]["total"] == 4
    assert sorted((e["line"], e["part"]) for e in render) == [(1, 1), (1, 2), (1, 3), (2, 1)]
    records = [first.parts[i].record(plan.project, 1) for i in range(3)]
    assert [(r["line"], r["part"], r["spoken"]) for r in records] == [
        (1, k + 1, p.text) for k, p in enumerate(first.parts)]

    # the export: line 1 is its parts' takes joined with the synthesizer's own pauses
    pauses = [c.pause_after_s for c in line_parts(first.spoken, request)]
    assert pauses == [0.3, 0.3, 0.0]
    takes = [sf.read(reading.take_audio(plan.project, p.key, 1), dtype="float32")[0]
             for p in first.parts]
    joined = np.concatenate([np.concatenate([t, np.zeros(round(s * SAMPLE_RATE), np.float32)])
                             for t, s in zip(takes, pauses, strict=True)])
    audio, rate = sf.read(tmp_path / "night.wav", dtype="float32")
    assert rate == SAMPLE_RATE
    head = round(request.head_s * SAMPLE_RATE)
    np.testing.assert_allclose(audio[head:head + len(joined)], joined, atol=2e-4)
    srt = (tmp_path / "night.srt").read_text(encoding="utf-8")
    s, ms = divmod(round((head + len(joined)) * 1000 / SAMPLE_RATE), 1000)
    assert f"00:00:00,750 --> 00:00:{s:02d},{ms:03d}" in srt, srt
    assert result["rendered"] == 4


def test_a_flagged_part_is_retried_alone(workspace: Path, tmp_path: Path) -> None:
    """A part whose take has a problem gets a new take with the next seed; the line's
    other parts keep theirs, and the line is flagged until its part is good."""
    request = _request(workspace, tmp_path)
    read_events(request)
    plan = make_plan(request)
    second = plan.line(1).part(1)
    record = second.record(plan.project, 1)
    # the take as a render that heard it loop records it
    write_json(reading.take_record(plan.project, second.key, 1),
               {**record, "problems": ["loop"]})
    assert flagged_lines(make_plan(request)) == [1]
    result, events = read_events(request.replace(retries=1))
    assert _seeds(request) == [[1], [1, 2], [1], [1]]
    assert result["retried"] == [1] and result["rendered"] == 1
    render = [e.data for e in events if e.kind == "progress" and e.data["stage"] == "render"
              and not e.data.get("loading")]
    assert [(e["line"], e["part"], e["total"]) for e in render] == [(1, 2, 1)]
    assert flagged_lines(make_plan(request)) == []


def test_an_edit_of_one_sentence_renders_only_its_part(workspace: Path,
                                                       tmp_path: Path) -> None:
    """A long paragraph edited in one sentence: the other parts keep their takes (the
    files are not written again), and a part that moved in its line is still itself."""
    request = _request(workspace, tmp_path)
    read_events(request)
    plan = make_plan(request)
    files = {p.text: reading.take_audio(plan.project, p.key, 1) for p in plan.line(1).parts}
    stamps = {text: path.stat().st_mtime_ns for text, path in files.items()}
    script = Path(request.script)
    script.write_text(SCRIPT.replace("The bay was calm all night.", "The sea was calm at midnight.")
                      .replace("The lamp was lit at dusk. ", "Rain fell on the roof all evening. "
                               "The lamp was lit at dusk. "), encoding="utf-8")
    result, events = read_events(request)
    assert result["rendered"] == 2  # the new first sentence and the edited one
    render = [e.data for e in events if e.kind == "progress" and e.data["stage"] == "render"
              and not e.data.get("loading")]
    assert sorted(e["part"] for e in render) == [1, 3]
    parts = make_plan(request).line(1).parts
    assert [p.text for p in parts] == ["Rain fell on the roof all evening.",
                                       "The lamp was lit at dusk.",
                                       "The sea was calm at midnight.",
                                       "Nobody spoke until the morning came."]
    kept = {p.text: reading.take_audio(plan.project, p.key, 1) for p in parts}
    for text in ("The lamp was lit at dusk.", "Nobody spoke until the morning came."):
        assert kept[text] == files[text] and kept[text].stat().st_mtime_ns == stamps[text]


def test_regenerate_and_pick_one_part_from_the_command_line(
        workspace: Path, tmp_path: Path) -> None:
    request = _request(workspace, tmp_path)
    read_events(request)
    args = ["read", request.script, "--workspace", str(workspace), "--voice", "ada",
            "--max-frames", str(SHORT), "--chunk-chars", str(CHUNK), "--retries", "0",
            "--no-word-check"]
    made, picked, whole, one = cli_ends([*args, "--regenerate", "1.2"],
                                        [*args, "--pick", "1.2=1"],
                                        [*args, "--pick", "1=1"],
                                        [*args, "--regenerate", "2", "--pick", "2=1"])
    assert made["event"] == "result" and made["rendered"] == 1, made
    assert picked["event"] == "result", picked
    # a line of several parts names the part
    assert whole["event"] == "error" and "1.K" in whole["hint"], whole
    assert one["event"] == "result" and one["rendered"] == 1, one
    plan = make_plan(request)
    parts = plan.line(1).parts
    assert [p.seeds for p in parts] == [[1], [1, 2], [1]]
    assert [p.chosen for p in parts] == [None, 1, None]
    # a line said in one take: `2` is its take, as before lines had parts
    assert (plan.line(2).seeds, plan.line(2).chosen) == ([1, 2], 2)


def test_a_project_rendered_before_lines_had_parts_keeps_its_takes(
        workspace: Path, tmp_path: Path) -> None:
    """Takes of whole lines (before a take was a sentence group) are kept and exported:
    a one-part line's take is its part's; a line of several parts keeps its whole take
    (and says so) until a new take of it is asked for."""
    request = _request(workspace, tmp_path, out=str(tmp_path / "night.wav"),
                       loudness_lufs=None, room_tone_db=None, peak_dbfs=0.0)
    plan = make_plan(request)
    first, second = plan.line(1), plan.line(2)
    # the project as a render before parts left it: each line's take under its line key
    tone = (0.2 * np.sin(2 * np.pi * 220 * np.arange(SAMPLE_RATE) / SAMPLE_RATE)
            ).astype(np.float32)
    for planned in (first, second):
        key = take_key(planned.identity, planned.model)
        reading.takes_dir(plan.project, key).mkdir(parents=True)
        sf.write(reading.take_audio(plan.project, key, 1), tone, SAMPLE_RATE)
        write_json(reading.take_record(plan.project, key, 1),
                   {"identity": planned.identity, "model": planned.model,
                    "line": planned.number, "text": planned.line.text, "seed": 1,
                    "problems": []})
    assert second.key == take_key(second.identity, second.model)

    result, events = read_events(request)
    assert result["rendered"] == 0, "nothing made before is made again"
    notes = [e.data["message"] for e in events if e.kind == "log"]
    assert any("1 line (1) keep the whole-line take" in n for n in notes), notes
    audio, _ = sf.read(tmp_path / "night.wav", dtype="float32")
    head = round(request.head_s * SAMPLE_RATE)
    np.testing.assert_allclose(audio[head:head + len(tone)], tone, atol=2e-4)
    kept = make_plan(request).line(1)
    assert kept.whole and [p.seeds for p in kept.parts] == [[1]]

    result, _ = read_events(request.replace(out=None, regenerate=(1,)))
    assert result["rendered"] == 3
    cut = make_plan(request).line(1)
    assert not cut.whole and [p.seeds for p in cut.parts] == [[1], [1], [1]]
    old = take_key(first.identity, first.model)
    assert reading.take_seeds(plan.project, old) == [1], "the old take stays on disk"


def test_a_part_is_named_as_line_dot_part() -> None:
    with pytest.raises(InputError, match=r"LINE\.PART"):
        ReadRequest(script="a.txt", regenerate=("1.0",))
    with pytest.raises(InputError, match=r"LINE\.PART=SEED"):
        ReadRequest(script="a.txt", pick=("1.x=2",))
    assert ReadRequest(script="a.txt", regenerate=(3, "3.2"), pick=("3.2=1", "4=2"))



def test_a_whole_line_take_of_another_model_is_kept_when_asked(
        workspace: Path, tmp_path: Path) -> None:
    """A line of several parts whose whole-line take another model of its voice made:
    kept with `keep_other_models` (and said), else rendered again in parts."""
    request = _request(workspace, tmp_path)
    plan = make_plan(request)
    first = plan.line(1)
    other = take_key(first.identity, "another model")
    reading.takes_dir(plan.project, other).mkdir(parents=True)
    sf.write(reading.take_audio(plan.project, other, 1), np.full(2400, 0.1, np.float32),
             SAMPLE_RATE)
    write_json(reading.take_record(plan.project, other, 1),
               {"identity": first.identity, "model": "another model", "line": 1,
                "seed": 1, "problems": [], "created": "2026-01-01T00:00:00"})

    kept = make_plan(request.replace(keep_other_models=True))
    assert kept.other_model == [1] and kept.line(1).whole
    assert [(p.key, p.seeds, p.other_model) for p in kept.line(1).parts] == [
        (other, [1], "kept")]
    result, _ = read_events(request.replace(keep_other_models=True))
    assert result["rendered"] == 1 and result["other_model"] == [1]  # line 2 only

    result, _ = read_events(request)
    assert result["rendered"] == 3 and result["other_model"] == [1]
    assert [p.seeds for p in make_plan(request).line(1).parts] == [[1], [1], [1]]


def test_each_looping_part_is_retried_on_its_own_during_the_render(
        workspace: Path, tmp_path: Path) -> None:
    """The drone voice loops on every seed: each part of its line is retried with its
    own next seed, said with its line and part, and flags the line."""
    script = tmp_path / "drone.txt"
    script.write_text("Drone: Hum along with me until the lamp is lit. "
                      "Sing the old song again and again.\n",
                      encoding="utf-8")
    # long enough for the runaway guard's loop window (4 s) before the cap
    request = tiny_request(script=str(script), workspace=str(workspace), max_frames=64,
                           retries=1, chunk_chars=CHUNK)
    result, events = read_events(request)
    assert result["flagged"] == [1]
    parts = make_plan(request).line(1).parts
    assert [p.seeds for p in parts] == [[1, 2], [1, 2]]
    retried = sorted((e.data["line"], e.data["part"]) for e in events
                     if e.kind == "log" and e.data.get("retry_seed") == 2)
    assert retried == [(1, 1), (1, 2)]
    render = [e.data for e in events if e.kind == "progress" and e.data["stage"] == "render"
              and not e.data.get("loading")]
    assert [(e["done"], e["total"]) for e in render] == [(1, 2), (2, 2)]
