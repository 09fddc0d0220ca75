"""`read`: a script in cloned voices, line by line, on the tiny model (issue 42).

One workspace (tests/helpers/reading.py): `ada` and `bob`, instant voices of one base (one
model, one batch), and `drone`, a full export whose talker always loops. Renders are short
(`max_frames`), so each take is a second or two of audio.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import mutagen.id3
import mutagen.mp4
import pytest

from engine.config.read import ReadRequest
from engine.core.errors import InputError
from engine.core.events import Emitter, Event
from engine.layout import reading
from engine.layout.voice import open_voice
from engine.read import read
from engine.read.project import make_plan
from engine.read.pronounce import add_respelling, dictionary_file
from engine.read.script import ScriptNames, parse_epub, parse_text
from tests.helpers.reading import (
    SCRIPT,
    ebur128,
    ffmpeg_stats,
    instant_voice,
    read_workspace,
    tides_epub,
    tiny_request,
)
from tests.helpers.voices import DRONE, forced_export

SHORT = 24  # frames per chunk: about two seconds


@pytest.fixture(scope="module")
def workspace(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return read_workspace(tmp_path_factory.mktemp("read") / "ws", tiny_model_dir)


def _read(request: ReadRequest) -> tuple[dict[str, Any], list[Event]]:
    events: list[Event] = []
    return read(request, Emitter(events.append)), events


def _records(project: Path) -> dict[int, list[dict[str, Any]]]:
    """Every take's record, by line number."""
    from engine.core.atomic import read_json

    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((project / reading.TAKES_DIR).glob("*/*.json")):
        if path.name != reading.CHOSEN_FILE:
            record = read_json(path)
            out.setdefault(record["line"], []).append(record)
    return out


# -- the script ------------------------------------------------------------------------------

def test_markdown_chapters_dialogue_styles_and_pauses() -> None:
    script = parse_text(SCRIPT, "book.md", names=ScriptNames.of(["ada", "bob"], ["whispering"]))
    assert [c.title for c in script.chapters] == ["The Lighthouse", "The Storm", "The Morning"]
    lines = script.lines
    assert [(ln.speaker, ln.style, ln.text) for ln in lines] == [
        ("Ada", None, "The lamp was lit at dusk."),
        ("Bob", "whispering", "Did anyone see it?"),
        ("", None, "The wind rose over the bay."),
        ("", None, "Then it fell."),
        ("Ada", None, "Voxshard kept the light burning.")]
    assert lines[2].pause_s == 0.5 and lines[3].paragraph_end
    assert [ln.chapter for ln in lines] == [0, 0, 1, 1, 2]


def test_markdown_marks_and_wrapped_paragraphs() -> None:
    script = parse_text("Some **bold** and [a link](http://x) words\nwrapped on.\n\nNext.",
                        "a.md")
    assert [ln.text for ln in script.lines] == ["Some bold and a link words wrapped on.",
                                                "Next."]
    with pytest.raises(InputError, match="no words"):
        parse_text("# Only a title\n", "a.md")
    with pytest.raises(InputError, match="longer than"):
        parse_text("Wait [pause 90s] here.", "a.md")


def test_epub_chapters(tmp_path: Path) -> None:
    book = tmp_path / "b.epub"
    with zipfile.ZipFile(book, "w") as z:
        z.writestr("mimetype", "application/epub+zip")
        z.writestr("META-INF/container.xml", '<container><rootfiles><rootfile '
                   'full-path="OEBPS/content.opf"/></rootfiles></container>')
        z.writestr("OEBPS/content.opf", '<package><manifest>'
                   '<item id="c2" href="two.xhtml" media-type="application/xhtml+xml"/>'
                   '<item id="c1" href="one.xhtml" media-type="application/xhtml+xml"/>'
                   '</manifest><spine><itemref idref="c1"/><itemref idref="c2"/></spine>'
                   '</package>')
        z.writestr("OEBPS/one.xhtml", "<html><head><title>x</title></head><body>"
                   "<h1>First</h1><p>One &amp; only.</p><p>Two<br/>lines.</p></body></html>")
        z.writestr("OEBPS/two.xhtml", "<html><body><h2>Second</h2><p>Three.</p></body></html>")
    script = parse_epub(book)
    assert [c.title for c in script.chapters] == ["First", "Second"]
    assert [ln.text for ln in script.lines] == ["One & only.", "Two lines.", "Three."]


def test_an_epub_is_read_from_its_linear_content_not_its_table_of_contents(
        tmp_path: Path) -> None:
    """ebooklib's usual layout: the spine lists its `nav` document first, and a note the
    spine marks non-linear; neither is read aloud."""
    path = tides_epub(tmp_path / "tides.epub", note=True)
    script = parse_epub(path)
    assert [c.title for c in script.chapters] == ["Ebb", "Flow"]
    assert [ln.text for ln in script.lines] == ["The sea went out.", "The sea came back."]


# -- rendering and export --------------------------------------------------------------------

def test_book_in_two_voices_with_a_style_a_pronunciation_and_chapters(
        workspace: Path, tmp_path: Path) -> None:
    script = tmp_path / "book.md"
    script.write_text(SCRIPT, encoding="utf-8")
    add_respelling(workspace / reading.PRONUNCIATIONS_FILE, "voxshard", "vox shard")
    out = tmp_path / "out" / "book.m4b"
    request = tiny_request(script=str(script), out=str(out), workspace=str(workspace),
                           voice="ada", max_frames=SHORT, tracks=True, styles=("whispering",))
    result, events = _read(request)
    assert (result["lines"], result["chapters"], result["rendered"]) == (5, 3, 5)
    assert result["flagged"] == []
    # ada and bob are instant voices of one base: one model, rendered in one batch
    rendering = next(e for e in events if e.kind == "state" and e.data["state"] == "rendering")
    assert rendering.data["models"] == 1
    records = _records(Path(result["project"]))
    assert [records[n][0]["voice"] for n in range(1, 6)] == ["ada", "bob", "ada", "ada", "ada"]
    assert records[2][0]["style"] == "whispering"
    # the respelling is what the model was given; the script's words are kept
    assert records[5][0]["spoken"] == "vox shard kept the light burning."
    assert records[5][0]["text"] == "Voxshard kept the light burning."
    assert "Voxshard" in script.read_text(encoding="utf-8")
    exported = _check_m4b(out, request, result)
    _check_mp3_and_levels(out, request, result, exported)
    _check_edits(script, request, Path(result["project"]))


def _check_m4b(out: Path, request: ReadRequest, result: dict[str, Any]) -> dict[str, float]:
    """The M4B's chapters (read back by mutagen), subtitles and tracks; returns each
    chapter's start as the export says it."""
    mp4 = mutagen.mp4.MP4(out)
    chapters = [(c.title, c.start) for c in mp4.chapters]
    assert [t for t, _ in chapters] == ["The Lighthouse", "The Storm", "The Morning"]
    starts = [round(s, 2) for _, s in chapters]
    assert starts[0] == 0 and starts[0] < starts[1] < starts[2] < mp4.info.length
    exported = {c["title"]: c["start_s"] for c in result["export"]["chapters"]}
    assert starts[1] == pytest.approx(exported["The Storm"], abs=0.01)
    # the subtitles: a cue per line, line 3 where the second chapter starts
    vtt = out.with_suffix(".vtt").read_text(encoding="utf-8")
    assert vtt.startswith("WEBVTT") and vtt.count(" --> ") == 5
    srt = out.with_suffix(".srt").read_text(encoding="utf-8").split("\n\n")
    assert srt[2].splitlines()[1].startswith("00:00:0") and "The wind rose" in srt[2]
    seconds = exported["The Storm"] + request.head_s  # the chapter opens on room tone
    assert srt[2].splitlines()[1][:12] == (f"00:00:{int(seconds):02d},"
                                           f"{round(seconds * 1000) % 1000:03d}")
    assert sorted(p.name for p in (out.parent / "book-tracks").iterdir()) == ["ada.wav",
                                                                            "bob.wav"]
    return exported


def _check_mp3_and_levels(out: Path, request: ReadRequest, result: dict[str, Any],
                          exported: dict[str, float]) -> None:
    """The same takes as an MP3 (nothing rendered again), and both files' levels as
    FFmpeg's own meter reads them."""
    # the same takes as an MP3: its chapters are ID3 CHAP frames; nothing is rendered again
    mp3 = out.with_suffix(".mp3")
    again, _ = _read(request.replace(out=str(mp3), subtitles=False, tracks=False))
    assert again["rendered"] == 0
    frames = mutagen.id3.ID3(mp3).getall("CHAP")
    assert [f.sub_frames["TIT2"].text[0] for f in frames] == ["The Lighthouse", "The Storm",
                                                             "The Morning"]
    assert frames[1].start_time == pytest.approx(exported["The Storm"] * 1000, abs=10)
    # the level of the file as written (a lossy encoder moves it), read by FFmpeg's own
    # EBU R128 meter: on the -18 LUFS asked, and what the export says of itself
    for written, exported_file in ((again["export"], mp3), (result["export"], out)):
        measured = ebur128(exported_file)
        assert measured["I"] == pytest.approx(-18.0, abs=0.5), (exported_file, measured)
        assert written["loudness_lufs"] == pytest.approx(measured["I"], abs=0.3)
        assert written["true_peak_dbtp"] == pytest.approx(
            20 * math.log10(measured["true_peak"]), abs=0.5)
        assert f"{written['loudness_lufs']:.1f} LUFS, true peak" in written["level"]
    assert again["summary"].endswith(f"wrote {mp3} ({again['export']['level']})")


def _check_edits(script: Path, request: ReadRequest, project: Path) -> None:
    """An edit, a pronunciation, a new take and a pick each render only what they
    change."""
    # an edit re-renders only its line; the other takes are the same files
    before = {p: p.stat().st_mtime_ns for p in project.glob("takes/*/*.wav")}
    script.write_text(SCRIPT.replace("Then it fell.", "Then it calmed."), encoding="utf-8")
    again, _ = _read(request.replace(out=None))
    assert (again["rendered"], again["reused"]) == (1, 4)
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())
    assert sorted(r["text"] for r in _records(project)[4]) == ["Then it calmed.",
                                                               "Then it fell."]

    # a pronunciation added for the project renders again only the line it changes
    add_respelling(project / reading.PRONUNCIATIONS_FILE, "bay", "bae")
    third, _ = _read(request.replace(out=None))
    assert (third["rendered"], third["reused"]) == (1, 4)
    assert any(r["spoken"] == "The wind rose over the bae." for r in _records(project)[3])

    # a new take of one line, chosen; then the first one picked back
    fourth, _ = _read(request.replace(out=None, regenerate=(1,)))
    assert fourth["rendered"] == 1
    plan = make_plan(request)
    assert plan.line(1).seeds == [1, 2] and plan.line(1).chosen == 2
    _read(request.replace(out=None, pick=("1=1",)))
    assert make_plan(request).line(1).chosen == 1


def test_a_loop_is_retried_with_another_seed_then_flagged(workspace: Path,
                                                          tmp_path: Path) -> None:
    script = tmp_path / "drone.txt"
    script.write_text("Drone: Hum along with me.\n", encoding="utf-8")
    # long enough for the runaway guard's loop window (4 s) before the cap
    request = tiny_request(script=str(script), workspace=str(workspace), max_frames=64,
                           retries=1)
    result, events = _read(request)
    assert result["flagged"] == [1]
    takes = _records(Path(result["project"]))[1]
    assert [t["seed"] for t in takes] == [1, 2]
    assert all(t["problems"] == ["loop"] for t in takes)
    retried = [e for e in events if e.kind == "log" and e.data.get("retry_seed") == 2]
    assert retried and retried[0].data["problems"] == ["loop"]


def test_a_stopped_render_keeps_its_takes_and_goes_on(workspace: Path, tmp_path: Path) -> None:
    """The command stopped as the window stops it (SIGTERM) after its first finished line:
    exit 130, the finished takes kept; the next run renders only the others."""
    script = tmp_path / "six.txt"
    script.write_text("\n\n".join(f"Line number {n} of six." for n in range(1, 7)) + "\n",
                      encoding="utf-8")
    args = [sys.executable, "-m", "engine.cli.main", "--json", "read", str(script),
            "--workspace", str(workspace), "--voice", "ada", "--max-frames", str(SHORT),
            "--rows", "1", "--no-word-check"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert proc.stdout is not None
    for raw in proc.stdout:
        event = json.loads(raw)
        if event["event"] == "progress" and event.get("stage") == "render" \
                and not event.get("loading"):
            assert event["done"] == 1 and event["total"] == 6 and event["eta_s"] is not None
            proc.send_signal(signal.SIGTERM)
            break
    proc.stdout.read()
    assert proc.wait(timeout=120) == 130
    kept = sum(len(takes) for takes in _records(tmp_path / "six.read").values())
    assert 1 <= kept < 6
    result, _ = _read(tiny_request(script=str(script), workspace=str(workspace), voice="ada",
                                   max_frames=SHORT))
    assert (result["rendered"], result["reused"]) == (6 - kept, kept)


def test_a_line_is_said_in_words_and_its_text_kept(workspace: Path, tmp_path: Path) -> None:
    script = tmp_path / "n.md"
    script.write_text("Bob: We sailed **3** miles \U0001F600.\n", encoding="utf-8")
    line = make_plan(tiny_request(script=str(script), workspace=str(workspace))).line(1)
    assert (line.line.text, line.spoken) == ("We sailed 3 miles \U0001F600.",
                                             "We sailed three miles.")


def test_bad_requests_say_what_to_do(workspace: Path, tmp_path: Path) -> None:
    script = tmp_path / "s.txt"
    script.write_text("Carol: Hello.\n", encoding="utf-8")
    with pytest.raises(InputError, match="no voice 'carol'"):
        make_plan(tiny_request(script=str(script), workspace=str(workspace),
                               cast=("Carol=carol",)))
    # not a speaker the read knows: the narrator's words
    with pytest.raises(InputError, match="narrator") as info:
        make_plan(tiny_request(script=str(script), workspace=str(workspace)))
    assert info.value.settings == ["read.voice"]  # each surface words it (issue 39)
    with pytest.raises(InputError, match=r"book\.m4b"):
        ReadRequest(script=str(script), out=str(tmp_path / "book.ogg"))
    with pytest.raises(InputError, match="NAME=VOICE"):
        ReadRequest(script=str(script), cast=("carol",))


# -- a take is one line's, said by one model (issue 50) ---------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The real `read` command, run to its end."""
    return subprocess.run([sys.executable, "-m", "engine.cli.main", "read", *args,
                           "--no-word-check"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})


def _cli_read(*args: str) -> str:
    """The real `read` command; its summary (stdout)."""
    done = _cli(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _ada_reads(workspace: Path, script: Path, text: str) -> tuple[ReadRequest, Path]:
    """`text` read by ada (short takes); the request and its project."""
    script.write_text(text, encoding="utf-8")
    request = tiny_request(script=str(script), workspace=str(workspace), voice="ada",
                           max_frames=SHORT)
    result, _ = _read(request)
    return request, Path(result["project"])


def test_alike_lines_have_their_own_takes(workspace: Path, tmp_path: Path) -> None:
    request, project = _ada_reads(workspace, tmp_path / "yes.txt", "Yes.\n\nNo.\n\nYes.\n")
    assert len(list((project / reading.TAKES_DIR).iterdir())) == 3
    # a new take of line 3 is line 3's: line 1 keeps its one take, and uses it
    _read(request.replace(regenerate=(3,)))
    plan = make_plan(request)
    assert (plan.line(1).seeds, plan.line(1).chosen) == ([1], None)
    assert (plan.line(3).seeds, plan.line(3).chosen) == ([1, 2], 2)


def test_a_voice_that_now_speaks_with_another_model_is_read_again(
        workspace: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """`ada` read as its instant voice, then trained (a full export in its folder): the
    takes say which model made them, so its lines are rendered again, or kept when asked."""
    ws = tmp_path / "ws"
    shutil.copytree(workspace, ws)
    script = tmp_path / "two.txt"
    script.write_text("Ada: The lamp was lit.\n\nBob: So it was.\n", encoding="utf-8")
    args = (str(script), "--workspace", str(ws), "--max-frames", str(SHORT))
    assert "2 rendered, 0 kept" in _cli_read(*args)
    forced_export(tiny_model_dir, ws / "ada" / "exports" / "ada-v1", DRONE)

    kept = _cli_read(*args, "--keep-other-models")
    assert "0 rendered, 2 kept" in kept and "1 line now from another model of ada: kept" in kept
    again = _cli_read(*args)
    assert "1 rendered, 1 kept" in again and "1 line now from another model of ada" in again
    records = _records(tmp_path / "two.read")
    assert len({r["model"] for r in records[1]}) == 2 and len(records[2]) == 1
    assert "0 rendered, 2 kept" in _cli_read(*args)


def test_a_new_take_of_a_line_kept_from_another_model_is_the_new_models(
        workspace: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(workspace, ws)
    request, project = _ada_reads(ws, tmp_path / "kept.txt", "Kept as it was.\n")
    forced_export(tiny_model_dir, ws / "ada" / "exports" / "ada-v1", DRONE)
    kept = request.replace(keep_other_models=True)
    old = make_plan(kept).line(1)
    assert (old.other_model, old.seeds) == ("kept", [1]) and old.key != old.own_key
    result, _ = _read(kept.replace(regenerate=(1,)))
    assert result["rendered"] == 1
    line = make_plan(kept).line(1)
    assert (line.key, line.seeds, line.chosen, line.other_model) == (old.own_key, [1], 1, "")
    # the first take is the instant voice's, the new one the export's
    assert [r["model"] for r in _records(project)[1]].count(line.model) == 1
    assert len({r["model"] for r in _records(project)[1]}) == 2


def test_a_voice_model_is_named_by_its_content_not_its_place(
        workspace: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """The same voice copied elsewhere is the same model (its takes stay good); its
    instant voice made again from another clip is another."""
    moved = tmp_path / "moved"
    shutil.copytree(workspace, moved)
    here = make_plan(tiny_request(script=str(_script(tmp_path)), workspace=str(workspace),
                                   voice="ada"))
    there = make_plan(tiny_request(script=str(_script(tmp_path)), workspace=str(moved),
                                   voice="ada"))
    assert here.lines[0].model == there.lines[0].model
    assert here.lines[0].key == there.lines[0].key
    shutil.rmtree(moved / "ada")
    instant_voice(moved, "Ada", tiny_model_dir, 300.0)
    again = make_plan(tiny_request(script=str(_script(tmp_path)), workspace=str(moved),
                                   voice="ada"))
    assert again.lines[0].model != here.lines[0].model


def _script(folder: Path) -> Path:
    script = folder / "one.txt"
    script.write_text("One line.\n", encoding="utf-8")
    return script


def test_a_project_made_before_takes_named_their_model_is_read_again(
        workspace: Path, tmp_path: Path) -> None:
    request, project = _ada_reads(workspace, tmp_path / "old.txt", "An old line.\n")
    # the layout of such a project: the key from the line and its voice's name only
    (folder,) = (project / reading.TAKES_DIR).iterdir()
    old = hashlib.sha256(json.dumps(["An old line.", "ada", None, "An old line.", "auto", 160,
                                     SHORT]).encode()).hexdigest()[:20]
    folder.rename(folder.with_name(old))
    for record in folder.with_name(old).glob("*.json"):
        data = json.loads(record.read_text(encoding="utf-8"))
        record.write_text(json.dumps({k: v for k, v in data.items()
                                      if k not in ("identity", "model")}), encoding="utf-8")
    assert make_plan(request.replace(keep_other_models=True)).line(1).seeds == [1]
    again, _ = _read(request)
    assert (again["rendered"], again["other_model"]) == (1, [1])
    assert "1 line now from another model of ada" in again["summary"]


def test_a_stopped_render_goes_on_with_its_retries_and_keeps_its_flags(
        workspace: Path, tmp_path: Path) -> None:
    """A render stopped after a line's first failed take (as a retries=0 run leaves it):
    the next run makes the retry; the runs after it still say the line is flagged."""
    script = tmp_path / "drone.txt"
    script.write_text("Drone: Hum along with me.\n", encoding="utf-8")
    request = tiny_request(script=str(script), workspace=str(workspace), max_frames=64,
                           retries=0)
    first, _ = _read(request)
    assert (first["rendered"], first["flagged"]) == (1, [1])
    resumed, _ = _read(request.replace(retries=1))
    assert (resumed["rendered"], resumed.get("retried"), resumed["flagged"]) == (1, [1], [1])
    assert [t["seed"] for t in _records(Path(first["project"]))[1]] == [1, 2]
    later, _ = _read(request.replace(retries=1))
    assert (later["rendered"], later["flagged"]) == (0, [1])
    assert "lines 1 flagged" in later["summary"]


# -- what a script's marks name (issue 50) -----------------------------------------------------

def test_only_known_speakers_and_styles_are_marks(workspace: Path, tmp_path: Path) -> None:
    script = tmp_path / "notes.md"
    script.write_text("Note: the tide turns at six.\n\n* Item one: first thing\n\n"
                      "Bob: [whispering] He wrote [sic] it twice.[^1] [laughs] Then left."
                      "\n\n[^1]: A footnote, not to be read.\n\n"
                      "Ada: Wait. [pause 2 seconds] Go. [500 ms pause] Stop. [beat] Done.\n",
                      encoding="utf-8")
    request = tiny_request(script=str(script), workspace=str(workspace), voice="ada",
                           styles=("Whispering",))
    lines = make_plan(request).script.lines
    assert [(ln.speaker, ln.style, ln.text, ln.pause_s) for ln in lines] == [
        ("", None, "Note: the tide turns at six.", None),
        ("", None, "Item one: first thing", None),
        ("Bob", "whispering", "He wrote [sic] it twice. [laughs] Then left.", None),
        ("Ada", None, "Wait.", 2.0), ("Ada", None, "Go.", 0.5), ("Ada", None, "Stop.", 1.0),
        ("Ada", None, "Done.", None)]
    # undeclared, a style is words
    plain = make_plan(request.replace(styles=())).script.lines
    assert plain[2].text == "[whispering] He wrote [sic] it twice. [laughs] Then left."


def test_a_pause_whose_length_cannot_be_read_is_refused_with_its_line(
        workspace: Path, tmp_path: Path) -> None:
    script = tmp_path / "odd.txt"
    script.write_text("The first line.\n\nA second one.\n\nThen [pause for effect] go.\n",
                      encoding="utf-8")
    done = _cli(str(script), "--workspace", str(workspace), "--voice", "ada")
    assert done.returncode != 0
    assert "odd.txt line 5: [pause for effect] looks like a pause" in done.stderr
    assert not (tmp_path / "odd.read" / reading.TAKES_DIR).exists()


# -- where a pronunciation applies (issue 50) --------------------------------------------------

def test_a_pronunciation_applies_where_its_scope_says(workspace: Path, tmp_path: Path) -> None:
    """A language entry applies to the lines of voices of that language under the default
    `--language auto`; `--say-scope` names a voice folder, or is refused unwritten."""
    ws = tmp_path / "ws"
    shutil.copytree(workspace, ws)
    add_respelling(ws / reading.PRONUNCIATIONS_FILE, "tide", "tyde", language="english")
    script = tmp_path / "tide.txt"
    script.write_text("Ada: The tide came in.\n\nBob: The tide went out.\n", encoding="utf-8")
    request = tiny_request(script=str(script), workspace=str(ws))
    assert [p.spoken for p in make_plan(request).lines] == ["The tyde came in.",
                                                           "The tyde went out."]
    assert make_plan(request.replace(language="german")).lines[0].spoken == \
        "The tide came in."

    refused = _cli(str(script), "--workspace", str(ws), "--say", "came=kame",
                   "--say-scope", "voice:ada/instant")
    assert refused.returncode != 0 and "voice:ada/instant names no voice folder" in \
        refused.stderr
    assert not list(ws.rglob(f"instant/{reading.PRONUNCIATIONS_FILE}"))
    add_respelling(dictionary_file("voice:ada", tmp_path / "tide.read", ws), "in", "inn")
    assert [p.spoken for p in make_plan(request).lines] == ["The tyde came inn.",
                                                           "The tyde went out."]


# -- what read says before it renders (issue 50) -----------------------------------------------

def test_a_style_its_voice_cannot_take_is_said_once_per_line(workspace: Path,
                                                             tmp_path: Path) -> None:
    """`speak`'s rule (`instruct_note`): an instant voice clones on a Base model, which
    takes no instruction, so read says so for the line, before rendering it."""
    script = tmp_path / "hush.txt"
    script.write_text("Bob: [whispering] Hush now.\n\nAda: Fine.\n", encoding="utf-8")
    _, events = _read(tiny_request(script=str(script), workspace=str(workspace),
                                   styles=("whispering",), max_frames=SHORT))
    said = [e for e in events if e.kind == "log" and "instruction" in str(e.data["message"])]
    assert [(e.data["line"], e.data["level"]) for e in said] == [(1, "warning")], \
        [e.data for e in events if e.kind == "log"]
    assert "whispering" in said[0].data["message"] and "ignored" in said[0].data["message"]


def test_a_workspace_that_is_not_there_is_said_as_such(tmp_path: Path) -> None:
    script = tmp_path / "s.txt"
    script.write_text("Hello.\n", encoding="utf-8")
    done = _cli(str(script), "--workspace", str(tmp_path / "nowhere"))
    assert done.returncode != 0
    assert f"The workspace {tmp_path / 'nowhere'} does not exist" in done.stderr
    assert "reference-base" not in done.stderr and "serve" not in done.stderr


def test_numbers_are_said_in_each_lines_language_and_the_voice_is_the_fallback(
        workspace: Path, tmp_path: Path) -> None:
    """Under the default `--language auto` a German line read by an English voice says its
    numbers in German (the words tell), and a line too short to tell ("OK 5.") says them
    in its voice's language: the speech server's rule (`engine.text.spoken_text`)."""
    ws = tmp_path / "ws"
    shutil.copytree(workspace, ws)
    open_voice(ws / "bob").set_language("german")
    script = tmp_path / "n.txt"
    script.write_text("Ada: Es sind heute 21 Grad.\n\nBob: OK 5.\n\nAda: OK 5.\n",
                      encoding="utf-8")
    spoken = [p.spoken for p in make_plan(tiny_request(script=str(script), workspace=str(ws))
                                          ).lines]
    assert spoken == ["Es sind heute einundzwanzig Grad.", "OK fünf.", "OK five."]


def test_the_time_left_is_the_render_rate_not_the_models_load(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100 s model load, then a take (a part) of half the characters in 10 s: 10 s left
    (counting the load gave 110 s, a hundred times the render on a real book); before any
    take, the load is said as loading, with no estimate."""
    from types import SimpleNamespace

    from engine.read import render

    clock = [0.0]
    monkeypatch.setattr(render.time, "perf_counter", lambda: clock[0])
    events: list[Event] = []
    parts = [SimpleNamespace(index=0, text="x" * 50) for _ in (1, 2)]
    attempts = [SimpleNamespace(planned=SimpleNamespace(number=n), part=part)
                for n, part in zip((1, 2), parts, strict=True)]
    progress = render._Progress(Emitter(events.append), parts)
    progress.loading()
    clock[0] = 100.0
    progress.loaded(100.0)
    clock[0] = 110.0
    progress.part_done(attempts[0], 3.0)
    first, second = (e.data for e in events)
    assert first["loading"] is True and first["eta_s"] is None and first["done"] == 0
    assert second["eta_s"] == pytest.approx(10.0) and second["done"] == 1


# -- an export an audiobook platform accepts (issue 52) ---------------------------------------

def test_an_acx_export_passes_acx_per_chapter_as_ffmpeg_reads_the_file(
        workspace: Path, tmp_path: Path) -> None:
    """Each chapter of the M4B opens on room tone and ends on it, its pauses are a quiet
    floor rather than digital zero, its peaks are held under -3 dBFS: what the export's
    per-chapter report says, and what FFmpeg's own astats/silencedetect read in the file."""
    script = tmp_path / "book.md"
    script.write_text(SCRIPT, encoding="utf-8")
    out = tmp_path / "acx.m4b"
    result, _ = _read(tiny_request(script=str(script), out=str(out), workspace=str(workspace),
                                   voice="ada", max_frames=SHORT, styles=("whispering",),
                                   subtitles=False, preset="acx"))
    check = result["export"]["check"]
    chapters = check["chapters"]
    assert [c["title"] for c in chapters] == ["The Lighthouse", "The Storm", "The Morning"]
    starts = [c.start for c in mutagen.mp4.MP4(out).chapters] + [None]
    for report, start, end in zip(chapters, starts, starts[1:], strict=False):
        read_back = ffmpeg_stats(out, start, end)
        assert read_back["peak"] <= -3.0, read_back
        assert -75 < read_back["floor"] <= -60, read_back  # a floor, not digital zero
        assert 0.5 <= read_back["head"] <= 1.0 and 1.0 <= read_back["tail"] <= 5.0, read_back
        assert -23 <= read_back["rms"] <= -18, read_back
        assert report["rms_db"] == pytest.approx(read_back["rms"], abs=0.3)
        assert report["peak_dbfs"] == pytest.approx(read_back["peak"], abs=0.3)
        assert report["noise_floor_db"] == pytest.approx(read_back["floor"], abs=1.0)
        assert report["head_s"] == pytest.approx(read_back["head"], abs=0.05)
        assert report["tail_s"] == pytest.approx(read_back["tail"], abs=0.05)
        assert report["passed"] and report["problems"] == []
    assert check["passed"] and "ACX check: 3 of 3 chapter(s) pass" in result["summary"]

    # digital silence in the pauses and no head: the check says so, and what to change
    flat = out.with_name("flat.m4b")
    again, _ = _read(tiny_request(script=str(script), out=str(flat), workspace=str(workspace),
                                  voice="ada", max_frames=SHORT, styles=("whispering",),
                                  subtitles=False, preset="acx", head_s=0.0)
                     .replace(room_tone_db=None))
    assert not again["export"]["check"]["passed"]
    problems = " ".join(again["export"]["check"]["chapters"][0]["problems"])
    assert "set the head" in problems
    assert ffmpeg_stats(flat, 0, None)["head"] < 0.5


def test_a_preset_fills_only_what_the_request_leaves_at_its_defaults() -> None:
    """`--preset acx --peak-dbfs -4` keeps -4 (the preset's -3.5 used to win, silently);
    the RMS level is a setting of its own, by flag too."""
    from engine.cli.main import build_parser

    acx = ReadRequest(script="book.md", preset="acx").for_export()
    assert (acx.rms_db, acx.peak_dbfs, acx.room_tone_db) == (-20.5, -3.5, -65.0)
    args = build_parser().parse_args(["read", "book.md", "--preset", "acx",
                                      "--peak-dbfs", "-4", "--rms-db", "-21"])
    mine = ReadRequest(script="book.md", preset=args.preset, peak_dbfs=args.peak_dbfs,
                       rms_db=args.rms_db).for_export()
    assert (mine.rms_db, mine.peak_dbfs) == (-21.0, -4.0)
    with pytest.raises(SystemExit):  # out of the setting's bounds, refused as it is read
        build_parser().parse_args(["read", "book.md", "--rms-db", "3"])


def test_one_loud_peak_is_limited_instead_of_lowering_the_whole_program(
        tmp_path: Path) -> None:
    """A take with one click at full scale: the program still reaches its loudness (read by
    FFmpeg's ebur128), its peaks held under the ceiling, and its pauses are room tone."""
    import numpy as np
    import soundfile as sf

    from engine.read.export import Placed, Program, write_program

    rng = np.random.default_rng(5)
    takes = []
    for i in range(2):
        t = np.arange(24000 * 3) / 24000
        voice = 0.1 * np.sin(2 * np.pi * 150 * t) * (1 + rng.standard_normal(t.size) * 0.2)
        if i == 0:
            voice[30000] = 0.99  # the one loud peak
        takes.append(tmp_path / f"take{i}.wav")
        sf.write(takes[-1], voice.astype(np.float32), 24000)
    program = Program(parts=[(takes[0], 72000), (None, 24000), (takes[1], 72000)],
                      lines=[Placed(1, 0, "ada", "one", 0, 72000),
                             Placed(2, 0, "ada", "two", 96000, 168000)],
                      chapters=[("One", 0)], tone_db=-65.0, ceiling=10 ** (-1 / 20))
    out = tmp_path / "peak.wav"
    written = write_program(program, out, -18.0, "peak")
    measured = ebur128(out)
    assert measured["I"] == pytest.approx(-18.0, abs=0.5), measured
    audio, _ = sf.read(out)
    assert np.abs(audio).max() <= 10 ** (-1 / 20) + 1e-4
    pause = audio[72000:96000]
    assert -68 < 20 * np.log10(np.sqrt(np.mean(pause ** 2))) < -62  # a floor, not zero
    assert written["loudness_lufs"] == pytest.approx(measured["I"], abs=0.3)


def _png(path: Path, color: tuple[int, int, int]) -> bytes:
    from PIL import Image

    Image.new("RGB", (16, 12), color).save(path)
    return path.read_bytes()


def test_an_epubs_title_author_and_cover_tag_the_m4b_and_the_request_overrides_them(
        workspace: Path, tmp_path: Path) -> None:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("id-52")
    book.set_title("Tides of the Bay")
    book.set_language("en")
    book.add_author("Ada Lovelace")
    cover = _png(tmp_path / "cover.png", (200, 40, 40))
    book.set_cover("cover.png", cover, create_page=False)
    chapter = epub.EpubHtml(title="Ebb", file_name="one.xhtml", lang="en")
    chapter.content = "<h1>Ebb</h1><p>The sea went out.</p>"
    book.add_item(chapter)
    book.toc = (chapter,)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", chapter]
    path = tmp_path / "tides.epub"
    epub.write_epub(str(path), book)

    out = tmp_path / "tides.m4b"
    request = tiny_request(script=str(path), out=str(out), workspace=str(workspace),
                           voice="ada", max_frames=SHORT, subtitles=False)
    _read(request)
    tags = mutagen.mp4.MP4(out).tags
    assert tags["\xa9nam"] == ["Tides of the Bay"] and tags["\xa9ART"] == ["Ada Lovelace"]
    assert bytes(tags["covr"][0]) == cover
    assert [c.title for c in mutagen.mp4.MP4(out).chapters] == ["Ebb"]

    # the request's own title, author and cover win over the book's (an MP3 here)
    other = _png(tmp_path / "other.png", (10, 90, 200))
    mp3 = tmp_path / "tides.mp3"
    _read(request.replace(out=str(mp3), title="Tides", author="Bob",
                          cover=str(tmp_path / "other.png")))
    id3 = mutagen.id3.ID3(mp3)
    assert id3["TIT2"].text == ["Tides"] and id3["TPE1"].text == ["Bob"]
    assert id3.getall("APIC")[0].data == other
