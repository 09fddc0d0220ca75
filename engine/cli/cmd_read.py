"""CLI: `read`, a script or a book in your voices.

    voxshard-engine read SCRIPT -o book.m4b --workspace WS --voice ada [--cast Bob=bob/instant]
    voxshard-engine read SCRIPT --regenerate 12          (new takes of line 12's parts, chosen)
    voxshard-engine read SCRIPT --regenerate 12.2        (a new take of its second part)
    voxshard-engine read SCRIPT --pick 12.2=3            (part 2 of line 12 uses seed 3;
                                                          12=3 for a line said in one take)
    voxshard-engine read SCRIPT --say "Voxshard=vox shard" [--say-scope workspace]

A line is said in parts (sentence groups of at most --chunk-chars, a take each). Run
again after an edit: only the lines whose text, voice, style or pronunciation changed are
rendered. Stopped (Ctrl+C, the window's Stop), it keeps every finished take and goes
on from there the next time.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine.cli.main import add_command
from engine.cli.settings import FIELD, add_field
from engine.config.read import ReadRequest
from engine.core.errors import InputError
from engine.core.events import Emitter

_FLAGS = ("workspace", "language", "seed", "chunk_chars", "max_frames", "retries",
          "line_pause_s", "paragraph_pause_s", "chapter_pause_s", "head_s", "loudness_lufs",
          "rms_db", "peak_dbfs", "room_tone_db", "preset", "subtitles", "tracks", "rows", "device",
          "dtype", "keep_other_models", "title", "author", "cover", "word_check",
          "wer_max", "asr", "chapter_titles", "title_pause_s")


def _say(args: argparse.Namespace, request: ReadRequest) -> dict[str, Any] | None:
    """`--say WORD=RESPELLING`: add it to the scope's dictionary (before the render)."""
    from engine.read.project import project_dir
    from engine.read.pronounce import add_respelling, dictionary_file

    if not args.say:
        return None
    path = dictionary_file(args.say_scope, project_dir(request),
                           Path(request.workspace) if request.workspace else None)
    added = []
    for item in args.say:
        word, sep, say = item.partition("=")
        if not sep or not word.strip() or not say.strip():
            raise InputError(f"--say {item!r} is not WORD=RESPELLING.",
                             "Write it as --say \"Voxshard=vox shard\".")
        add_respelling(path, word.strip(), say.strip(), pattern=args.say_pattern,
                       language=args.say_language)
        added.append(word.strip())
    return {"dictionary": str(path), "added": added}


def _read(args: argparse.Namespace, emitter: Emitter) -> dict[str, Any]:
    from engine.read import read

    values = {name: getattr(args, name) for name in _FLAGS}
    values["voice"] = args.narrator
    if args.no_loudness:
        values["loudness_lufs"] = None
    request = ReadRequest(script=args.script, out=args.output, project=args.project,
                          cast=tuple(args.cast or ()), styles=tuple(args.styles or ()),
                          regenerate=tuple(args.regenerate or ()),
                          pick=tuple(args.pick or ()), **values)
    said = _say(args, request)
    result = read(request, emitter)
    if said:
        result["pronunciations"] = said
    return result


def register(sub: Any) -> None:
    p = add_command(sub, "read", _read, "read a script or a book (text, Markdown, dialogue, "
                    "EPUB) in your voices, line by line, into WAV, FLAC, MP3 or M4B")
    p.add_argument("script", help="the script: .txt, .md (headings are chapters; `Name: "
                   "words` lines of a voice or --cast name are dialogue; [style] of a trained "
                   "or --styles style and [pause 1.5s] inline) or .epub")
    p.add_argument("-o", "--output", help="the export: book.m4b, book.mp3, book.flac or "
                   "book.wav (none: render the takes only)")
    p.add_argument("--project", help="the project folder keeping every take (default: "
                   "beside the script, NAME.read)")
    add_field(p, ReadRequest, "cast", action="append", metavar="NAME=VOICE",
              help="the voice of a script speaker (repeatable)", show_default=False)
    add_field(p, ReadRequest, "styles", action="append", metavar="STYLE",
              help="a style the script's [STYLE] sets, beyond its voices' trained ones "
              "(repeatable; any other bracket is words to say)", show_default=False)
    p.add_argument("--regenerate", action="append", metavar="LINE[.PART]",
                   help="render a new take of each part of this line (or of its part PART, "
                   "from 1) and choose it (repeatable)")
    p.add_argument("--pick", action="append", metavar="LINE[.PART]=SEED",
                   help="choose the take of this seed for the part (LINE alone: a line "
                   "said in one take) (repeatable)")
    p.add_argument("--say", action="append", metavar="WORD=RESPELLING",
                   help="add a pronunciation to the dictionary of --say-scope (repeatable)")
    p.add_argument("--say-scope", default="project",
                   help="where --say keeps it: project (default), workspace or voice:NAME")
    p.add_argument("--say-language", help="apply --say only to lines in this language")
    p.add_argument("--say-pattern", action="store_true",
                   help="--say's word is a regular expression")
    p.add_argument("--no-loudness", action="store_true", help="leave the export's level alone")
    # not dest "voice": the CLI takes an argument of that name for a folder
    add_field(p, ReadRequest, "voice", dest="narrator")
    for name in _FLAGS:
        add_field(p, ReadRequest, name, default=FIELD)
