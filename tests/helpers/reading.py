"""A workspace for `read` on the tiny model: two instant voices of one base (`ada`, `bob`:
one model, one batch) and the drone voice (`drone`: a full export that always loops), and
a three-chapter Markdown script in two voices with a style."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from engine.audio.resample import resample
from engine.config.read import ReadRequest
from engine.core.events import Emitter, Event
from engine.layout.tiers import write_instant
from engine.layout.voice import create_voice
from engine.prepare.instant import speaker_vector
from engine.read import read
from tests.helpers.voices import DRONE, forced_export

#: ms: a window job loads the tiny model and renders a line or two
JOB_S = 240_000

SCRIPT = """# The Lighthouse

Ada: The lamp was lit at dusk.
Bob: [whispering] Did anyone see it?

# The Storm

The wind rose over the bay. [pause 0.5s] Then it fell.

# The Morning

Ada: Voxshard kept the light burning.
"""


def instant_voice(workspace: Path, name: str, model_dir: Path, pitch: float) -> Path:
    """A voice whose only tier is an instant voice of the tiny base, cloned from a tone."""
    voice = create_voice(workspace / name.lower(), name, "english").path
    t = np.arange(int(24000 * 1.2)) / 24000
    clip = workspace / f"{name.lower()}-clip.wav"
    sf.write(clip, (0.3 * np.sin(2 * np.pi * pitch * t) * np.sin(np.pi * t / 1.2)
                    ).astype(np.float32), 24000)
    write_instant(voice, {"clip_id": "c0", "text": "hello there", "speaker": name,
                          "base": str(model_dir), "created": "2026-01-01T00:00:00"},
                  clip, speaker_vector(model_dir, clip))
    return voice


#: frames per chunk in the tests' renders: about two seconds of the tiny model's audio
SHORT = 24
#: two lines piper's 'joe' says well enough for the offline recogniser (WER 0 on both)
RIGHT = "Our train was delayed because of a fallen tree on the track."
OTHER = "How long does it take to walk to the station from here?"


def say_take(path: Path, text: str, synth: Callable[[str], tuple[np.ndarray, int]]) -> None:
    """Piper saying `text`, as the take at `path` (24 kHz, a take's level): a take of real
    speech where the tiny model says none."""
    audio, rate = synth(text)
    sf.write(path, 0.5 * resample(audio, rate, 24000), 24000)


def tiny_request(**fields: Any) -> ReadRequest:
    """A read on the tiny model, which says no words: every take would fail the word check,
    so it is off (tests/test_read_words.py checks takes of real speech)."""
    return ReadRequest(**{"word_check": False, **fields})


def read_events(request: ReadRequest) -> tuple[dict[str, Any], list[Event]]:
    """`read` run to its end: its result and every event it sent."""
    events: list[Event] = []
    return read(request, Emitter(events.append)), events


def tides_epub(path: Path, note: bool = False) -> Path:
    """An EPUB of two chapters ("Ebb", "Flow") as ebooklib writes a book: its `nav`
    document first in the spine; with `note`, a note the spine marks non-linear last."""
    from ebooklib import epub  # start-up cost: only the tests that write a book

    book = epub.EpubBook()
    book.set_identifier("id-50")
    book.set_title("Tides")
    book.set_language("en")
    chapters = []
    for name, title, words in (("one", "Ebb", "The sea went out."),
                               ("two", "Flow", "The sea came back.")):
        chapter = epub.EpubHtml(title=title, file_name=f"{name}.xhtml", lang="en")
        chapter.content = f"<h1>{title}</h1><p>{words}</p>"
        book.add_item(chapter)
        chapters.append(chapter)
    spine: list[Any] = ["nav", *chapters]
    if note:
        extra = epub.EpubHtml(title="Note", file_name="note.xhtml", lang="en")
        extra.content = "<p>A note to skip.</p>"
        book.add_item(extra)
        spine.append((extra, "no"))
    book.toc = tuple(chapters)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = spine
    epub.write_epub(str(path), book)
    return path


def read_workspace(ws: Path, model_dir: Path) -> Path:
    """Fill the workspace folder `ws` (made when missing) with ada, bob and drone."""
    ws.mkdir(parents=True, exist_ok=True)
    instant_voice(ws, "Ada", model_dir, 180.0)
    instant_voice(ws, "Bob", model_dir, 110.0)
    create_voice(ws / "drone", "Drone", "english")
    forced_export(model_dir, ws / "drone" / "exports" / "drone-v1", DRONE)
    return ws


def ebur128(path: Path) -> dict[str, float]:
    """FFmpeg's own EBU R128 meter (its `ebur128` filter, through PyAV) on a file as FFmpeg
    decodes it: {"I": integrated LUFS, "true_peak": linear true peak} — a measurement no
    code of Voxshard's takes part in."""
    import av

    found: dict[str, str] = {}
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        graph = av.filter.Graph()
        source = graph.add_abuffer(template=stream)
        meter = graph.add("ebur128", "metadata=1:peak=true")
        sink = graph.add("abuffersink")
        source.link_to(meter)
        meter.link_to(sink)
        graph.configure()

        def drain() -> None:
            while True:
                try:
                    found.update(sink.pull().metadata)
                except (av.BlockingIOError, av.EOFError):
                    return

        for frame in container.decode(stream):
            source.push(frame)
            drain()
        source.push(None)
        drain()
    return {"I": float(found["lavfi.r128.I"]), "true_peak": float(found["lavfi.r128.true_peak"])}


def ffmpeg_stats(path: Path, start_s: float, end_s: float | None) -> dict[str, float]:
    """FFmpeg's `astats` and `silencedetect` on the part of a file from `start_s` to
    `end_s` (cut by FFmpeg's `atrim`), as FFmpeg decodes it: {"rms", "peak", "floor" (the
    quietest half second's RMS), in dB; "head", "tail": seconds under -40 dB at each end}."""
    import av

    found: dict[str, str] = {}
    silences: list[tuple[str, float]] = []
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        graph = av.filter.Graph()
        source = graph.add_abuffer(template=stream)
        trim = graph.add("atrim", f"start={start_s}" + (f":end={end_s}" if end_s else ""))
        stamps = graph.add("asetpts", "PTS-STARTPTS")
        mono = graph.add("aformat", "channel_layouts=mono")
        silence = graph.add("silencedetect", "n=-40dB:d=0.25")
        stats = graph.add("astats", "metadata=1:length=0.5")
        sink = graph.add("abuffersink")
        chain = [source, trim, stamps, mono, silence, stats, sink]
        for a, b in itertools.pairwise(chain):
            a.link_to(b)
        graph.configure()
        samples = 0

        def drain() -> None:
            nonlocal samples
            while True:
                try:
                    frame = sink.pull()
                except (av.BlockingIOError, av.EOFError):
                    return
                samples += frame.samples
                found.update(frame.metadata)
                for kind in ("start", "end"):
                    if f"lavfi.silence_{kind}" in frame.metadata:
                        silences.append((kind, float(frame.metadata[f"lavfi.silence_{kind}"])))

        for frame in container.decode(stream):
            try:
                source.push(frame)
            except av.EOFError:  # atrim's end is reached
                break
            drain()
        else:
            source.push(None)
        drain()
    length = samples / stream.rate
    head = next(t for k, t in silences if k == "end") if silences[:1] == [("start", 0.0)] else 0
    tail = length - silences[-1][1] if silences and silences[-1][0] == "start" else 0.0
    level = {k: float(found[f"lavfi.astats.Overall.{v}"])
             for k, v in (("rms", "RMS_level"), ("peak", "Peak_level"), ("floor", "RMS_trough"))}
    return {**level, "head": head, "tail": tail}
