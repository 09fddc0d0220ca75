"""`read`'s render throughput: audio seconds made per wall second, many voices in one batch.

    python -m bench.bench_read [--voices 4] [--lines 32] [--frames 24] [--rows 8 1]
                               [--chars 5000] [--model DIR] [--device cpu] [--json out.json]

Builds a workspace of `--voices` instant voices of one base (the tiny random test model
unless `--model`), each cloned from its own tone, and a script of `--lines` dialogue
lines, the speakers taking turns, so every batch holds lines of several voices. For each
`--rows` it renders the whole script into a fresh project (`engine.read.read`, the
command's own path: the warm worker, every line submitted at once) and prints the
render's audio seconds, its time and audio seconds per second of rendering (the model's
and voices' load, once per render, is printed apart), beside the same script read by
one voice.

With `--chars N` it renders instead one narrator's prose script of about N characters
(paragraphs of twelve sentences, each paragraph a line of several takes) and prints its
characters and audio seconds per second of rendering.

Every chunk makes at most `--frames` codec frames (the tiny model rarely ends a sentence
by itself), so the work per line is bounded and alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401

SENTENCES = ["The lamp was lit at dusk.", "Did anyone see it from the shore?",
             "The wind rose over the bay.", "Then, slowly, it fell again.",
             "Nobody spoke until morning.", "We kept the light burning all night."]


def _workspace(root: Path, model: Path, voices: int) -> list[str]:
    from tests.helpers.reading import instant_voice

    ws = root / "ws"
    ws.mkdir()
    names = [f"V{i}" for i in range(voices)]
    for i, name in enumerate(names):
        instant_voice(ws, name, model, 110.0 + 30.0 * i)
    return [n.lower() for n in names]


def _script(path: Path, speakers: list[str], lines: int) -> None:
    rows = [f"{speakers[i % len(speakers)]}: {SENTENCES[i % len(SENTENCES)]}"
            for i in range(lines)]
    path.write_text("# Bench\n\n" + "\n".join(rows) + "\n", encoding="utf-8")


def _prose(path: Path, speaker: str, chars: int) -> int:
    """A narrator's script of about `chars` characters: paragraphs of twelve sentences, each
    paragraph one line of several takes (sentence groups); returns its length."""
    paragraphs, size, i = [], 0, 0
    while size < chars:
        paragraph = " ".join(f"{SENTENCES[(i + k) % len(SENTENCES)]}" for k in range(12))
        paragraphs.append(f"{speaker.capitalize()}: {paragraph}")
        size += len(paragraph)
        i += 1
    path.write_text("# Prose\n\n" + "\n\n".join(paragraphs) + "\n", encoding="utf-8")
    return size


def _render(root: Path, script: Path, rows: int, frames: int, device: str | None,
            tag: str) -> dict[str, float]:
    from engine.config.read import ReadRequest
    from engine.core.events import Emitter
    from engine.read import read

    result = read(ReadRequest(script=str(script), workspace=str(root / "ws"),
                              project=str(root / f"project-{tag}"), max_frames=frames,
                              rows=rows, retries=0, device=device,
                              word_check=False), Emitter())
    return {"rows": rows, "lines": result["lines"], "takes": result["rendered"],
            "audio_s": result["audio_s"],
            "load_s": result["load_s"], "render_s": result["render_s"],
            "audio_per_s": result["audio_per_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--voices", type=int, default=4)
    parser.add_argument("--lines", type=int, default=32)
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 1])
    parser.add_argument("--model", type=Path, help="a base model folder (default: tiny)")
    parser.add_argument("--chars", type=int, default=0,
                        help="instead: one narrator reading a prose script of this many "
                             "characters (e.g. 5000), at each --rows")
    parser.add_argument("--device")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-read-"))
    try:
        return _bench(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)  # takes of every line, several times over


def _bench(args: argparse.Namespace, root: Path) -> int:
    from engine.model.tiny import make_tiny_model

    model = args.model or make_tiny_model(root / "tiny", seed=0)
    speakers = _workspace(root, model, args.voices)
    if args.chars:
        return _bench_prose(args, root, speakers[0])
    many, one = root / "many.md", root / "one.md"
    _script(many, speakers, args.lines)
    _script(one, speakers[:1], args.lines)
    results = []
    # a first short render loads what every render loads once per process (the codec,
    # tokenizer files from disk cache), so no row pays for it alone
    _render(root, one, 1, 4, args.device, "warm")
    for rows in args.rows:
        for tag, script, voices in (("many", many, args.voices), ("one", one, 1)):
            found = _render(root, script, rows, args.frames, args.device, f"{tag}-{rows}")
            found["voices"] = voices
            results.append(found)
            print(f"rows {rows:2d}  voices {voices:2d}  lines {found['lines']:3d}  "
                  f"audio {found['audio_s']:7.1f} s  load {found['load_s']:5.1f} s  "
                  f"render {found['render_s']:7.1f} s  "
                  f"{found['audio_per_s']:6.3f} audio s/s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _bench_prose(args: argparse.Namespace, root: Path, speaker: str) -> int:
    """Throughput of one long prose script: characters and audio per second of rendering."""
    script = root / "prose.md"
    chars = _prose(script, speaker, args.chars)
    warm = script.with_name("warm.md")  # what every render loads once per process
    _prose(warm, speaker, 100)
    _render(root, warm, 1, 4, args.device, "warm")
    results = []
    for rows in args.rows:
        found = _render(root, script, rows, args.frames, args.device, f"prose-{rows}")
        found["chars"] = chars
        found["chars_per_s"] = round(chars / found["render_s"], 1) if found["render_s"] else 0
        results.append(found)
        print(f"rows {rows:2d}  chars {chars}  lines {found['lines']:3d}  "
              f"takes {found['takes']:4d}  audio {found['audio_s']:7.1f} s  "
              f"load {found['load_s']:5.1f} s  render {found['render_s']:7.1f} s  "
              f"{found['chars_per_s']:6.1f} chars/s  {found['audio_per_s']:6.3f} audio s/s",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
