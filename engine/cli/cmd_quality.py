"""CLI: speech recognition and evaluation.

    voxshard-engine transcribe VOICE [--asr SPEC] [--takes ID...] [--recheck] [--threshold X]
    voxshard-engine recognize FILE... [--asr SPEC] [--language LANG]
    voxshard-engine evaluate VOICE [--run R] [--checkpoints all|latest|best|STEP,...]
    voxshard-engine evaluate VOICE --run R --watch [--patience K]   (beside training)
    voxshard-engine import VOICE FILES... --transcribe [--asr SPEC]   (adds to `import`)

`--asr`: pocketsphinx (offline, English, the fallback), auto (a Whisper model
found in the Hugging Face cache, else pocketsphinx; VOXSHARD_ASR sets it), a
hub id such as Systran/faster-whisper-small, or a model folder.
"""

from __future__ import annotations

import argparse
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from engine.cli.main import add_command
from engine.cli.settings import FIELD, add_field
from engine.config.evaluate import EvaluateConfig
from engine.core.errors import InputError
from engine.core.events import Emitter

ASR_HELP = ("speech recognizer: pocketsphinx, auto (a cached Whisper model, else "
            "pocketsphinx), a hub id such as Systran/faster-whisper-small, or a folder")


def _transcribe(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    from engine.layout.voice import open_voice
    from engine.prepare.transcribe import transcribe_takes

    voice = open_voice(args.voice)
    return transcribe_takes(voice, args.asr, takes=args.takes or None, recheck=args.recheck,
                            threshold=args.threshold, device=args.device, on_event=em)


def _recognize(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    from engine.asr.recognizer import load_audio, load_recognizer

    rec = load_recognizer(args.asr, args.device)
    rows = []
    for i, f in enumerate(args.files):
        em.progress("recognize", i, len(args.files), file=f)
        heard = rec.transcribe(load_audio(f), args.language)
        rows.append({"file": f, **heard.to_dict(), "rtf": round(heard.rtf, 3)})
    em.progress("recognize", len(args.files), len(args.files))
    lines = [f"{r['file']}: {r['text'] or '(nothing heard)'}" for r in rows]
    return {"backend": rec.backend, "model": rec.model, "files": rows,
            "summary": "\n".join(lines)}


def _read_sentences(args: argparse.Namespace) -> list[str] | None:
    found = list(args.sentences or [])
    if args.sentences_file:
        try:
            text = Path(args.sentences_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"Cannot read {args.sentences_file}: {exc}.") from exc
        found += [line.strip() for line in text.splitlines() if line.strip()]
    return found or None


def _evaluate(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    from engine.config.speak import SpeakOptions
    from engine.quality.evaluate import EvaluateRequest, evaluate
    from engine.quality.watch import watch

    options = SpeakOptions(max_frames=args.max_frames, batch_size=args.batch_size)
    config = EvaluateConfig(**{f.name: getattr(args, f.name) for f in fields(EvaluateConfig)})
    request = EvaluateRequest(args.voice, args.run, args.checkpoints,
                              sentences=_read_sentences(args), seed=args.seed, asr=args.asr,
                              options=options, device=args.device, base=args.base,
                              out_dir=args.out_dir, config=config)
    if args.watch:
        return watch(request, interval_s=args.interval, idle_s=args.idle,
                     training_pid=args.training_pid, on_event=em)
    return evaluate(replace(request, zero_shot=not args.no_zero_shot,
                            export=args.export or not args.no_export, force=args.force), em)


def _import_with_transcribe(original: Any) -> Any:
    """`import ... --transcribe`: the voice area's import, then speech recognition over
    the takes it imported (`engine.prepare.importer` does the same with `transcribe=`)."""

    def handler(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
        result = original(args, em)
        if not getattr(args, "transcribe", False) or not result.get("imported"):
            return result
        from engine.layout.voice import open_voice
        from engine.prepare.importer import transcribe_imported

        heard = transcribe_imported(open_voice(args.voice), result["imported"],
                                    args.asr or True, em, None)
        lines = [x for x in str(result.get("summary", "")).splitlines()
                 if not x.endswith("have no transcript.")]
        lines.insert(1, heard["summary"])
        return {**result, "transcription": heard, "summary": "\n".join(lines)}

    return handler


def _extend_import(sub: Any) -> None:
    parser = sub.choices.get("import") if hasattr(sub, "choices") else None
    if parser is None:
        return
    parser.add_argument("--transcribe", action="store_true",
                        help="fill missing transcripts with speech recognition and flag "
                             "doubtful ones")
    parser.add_argument("--asr", default=None, help=ASR_HELP)
    parser.set_defaults(func=_import_with_transcribe(parser.get_default("func")))


def register(sub: Any) -> None:
    _extend_import(sub)

    p = add_command(sub, "transcribe", _transcribe,
                    "Fill missing transcripts with speech recognition; flag doubtful ones.")
    p.add_argument("voice", help="voice folder")
    p.add_argument("--asr", default=None, help=ASR_HELP)
    p.add_argument("--takes", nargs="+", default=None, metavar="ID",
                   help="only these takes (default: all)")
    p.add_argument("--recheck", action="store_true",
                   help="recognise again takes already checked with the same model")
    p.add_argument("--threshold", type=float, default=None,
                   help="word error rate above which a transcript is doubtful "
                        "(default 0.75 for pocketsphinx, 0.5 for Whisper)")
    p.add_argument("--device", default=None, help="cpu or cuda:N (Whisper only)")

    p = add_command(sub, "recognize", _recognize, "Print what speech recognition hears in "
                    "audio files.")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--asr", default=None, help=ASR_HELP)
    p.add_argument("--language", default=None, help="language name or code (default: detect)")
    p.add_argument("--device", default=None, help="cpu or cuda:N (Whisper only)")

    p = add_command(sub, "evaluate", _evaluate,
                    "Measure a run's checkpoints: speaker similarity, word error rate, "
                    "speaking rate, loudness; writes evaluation.json and report.html.")
    p.add_argument("voice", help="voice folder")
    p.add_argument("--run", default=None, help="run name (default: the newest with checkpoints)")
    p.add_argument("--checkpoints", default="all",
                   help="all, latest, best, or steps such as 100,200 (default: all)")
    p.add_argument("--asr", default=None, help=ASR_HELP)
    p.add_argument("--sentences", nargs="+", default=None, metavar="TEXT",
                   help="sentences to render instead of the 8 held-out ones")
    p.add_argument("--sentences-file", default=None, metavar="FILE",
                   help="sentences to render, one per line")
    p.add_argument("--seed", type=int, default=0, help="seed of every render (default 0)")
    p.add_argument("--max-frames", type=int, default=None,
                   help="cap on codec frames per sentence (12.5 per second)")
    p.add_argument("--batch-size", type=int, default=8, help="sentences rendered together")
    p.add_argument("--no-zero-shot", action="store_true", help="leave out the zero-shot clone")
    p.add_argument("--no-export", action="store_true", help="leave out the voice's export")
    p.add_argument("--export", default=None, metavar="FOLDER",
                   help="evaluate this export instead of the voice's latest")
    p.add_argument("--base", default=None, help="base model (default: the run's)")
    p.add_argument("--out", dest="out_dir", default=None, metavar="FOLDER",
                   help="output folder (default: <run>/evaluation)")
    p.add_argument("--force", action="store_true", help="measure again what was measured")
    p.add_argument("--device", default=None, help="cpu or cuda:N")
    for f in fields(EvaluateConfig):  # style renders, the best rule, early stop (--watch)
        add_field(p, EvaluateConfig, f.name, default=FIELD)
    p.add_argument("--watch", action="store_true",
                   help="keep running beside training: evaluate each new checkpoint as it "
                        "is written (until Ctrl-C, or --idle)")
    p.add_argument("--interval", type=float, default=15.0,
                   help="with --watch: seconds between looks at the run (default 15)")
    p.add_argument("--idle", type=float, default=None,
                   help="with --watch: stop after this many seconds without a new checkpoint")
    p.add_argument("--training-pid", type=int, default=None,
                   help="with --watch: the training process beside it; once it has ended "
                        "and every checkpoint it wrote is measured or noted, stop")
