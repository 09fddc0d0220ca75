"""CLI: `speak`, `compare` (checkpoint A/B folder) and `serve-speech` (warm worker)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..events import Emitter
from ..synth.options import FORMATS
from .main import add_command


def _read_text(args: argparse.Namespace) -> str:
    if args.text_file and args.text not in (None, ""):
        raise InputError("Give the text either as an argument or with --text-file, not both.")
    if args.text_file:
        path = Path(args.text_file).expanduser()
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise InputError(f"The text file {path} does not exist.") from exc
        except UnicodeDecodeError as exc:
            raise InputError(f"The text file {path} is not UTF-8 text.",
                             "Save it as UTF-8 and try again.") from exc
        except OSError as exc:
            raise InputError(f"The text file {path} cannot be read: {exc.strerror}.") from exc
    if args.text == "-":
        return sys.stdin.read()
    if args.text is None:
        raise InputError("No text was given.", "Pass the text, --text-file FILE, or - for stdin.")
    return str(args.text)


def _options(args: argparse.Namespace) -> Any:
    from ..synth.options import SpeakOptions

    values = {
        "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
        "repetition_penalty": args.repetition_penalty, "seed": args.seed,
        "language": args.language, "chunk_chars": args.chunk_chars,
        "max_frames": args.max_frames, "batch_size": args.batch_size,
        "loudness_lufs": None if args.no_loudness else args.loudness,
        "instruct": getattr(args, "instruct", None),
    }
    if args.greedy:
        values["do_sample"] = False
        values["subtalker_do_sample"] = False
    return SpeakOptions(**values)


def _speak(args: argparse.Namespace, emitter: Emitter) -> dict[str, Any]:
    from ..synth.options import audio_format
    from ..synth.synthesizer import Synthesizer
    from ..synth.text import split_text
    from ..synth.voice import resolve_source

    text = _read_text(args)
    options = _options(args)
    fmt = audio_format(args.output, args.format)
    # Check the text and voice before the (slow) model load, so mistakes fail fast.
    split_text(text, options.chunk_chars)
    source = resolve_source(args.model, checkpoint=args.checkpoint, reference=args.reference,
                            speaker=args.speaker, base=args.base,
                            reference_text=args.reference_text,
                            x_vector_only=args.x_vector_only)
    synth = Synthesizer.load(source, device=args.device, dtype=args.dtype, on_event=emitter)
    result = synth.speak_to_file(text, args.output, options, fmt, emitter, stream=args.stream)
    result["summary"] = (f"Wrote {result['path']} ({result['duration_s']:.1f} s of audio in "
                         f"{result['compute_s']:.1f} s, {result['rtf']:.2f}x real time, "
                         f"seed {result['seed']}, voice {source.label})")
    return result


def _compare(args: argparse.Namespace, emitter: Emitter) -> dict[str, Any]:
    from ..synth.compare import compare

    sentences = list(args.sentences or [])
    if args.sentences_file:
        path = Path(args.sentences_file).expanduser()
        if not path.is_file():
            raise InputError(f"The sentences file {path} does not exist.")
        sentences += [line for line in path.read_text(encoding="utf-8").splitlines()
                      if line.strip()]
    options = _options(args)
    return compare(args.target, args.out_dir, sentences or None, args.checkpoints or None,
                   options=options, zero_shot=not args.no_zero_shot,
                   reference=args.reference, base=args.base, device=args.device,
                   dtype=args.dtype, on_event=emitter)


def _serve(args: argparse.Namespace, emitter: Emitter) -> dict[str, Any]:
    from ..synth.worker import serve

    first = None
    if args.model:
        first = {"op": "load", "id": "initial", "voice": args.model,
                 "checkpoint": args.checkpoint, "reference": args.reference,
                 "reference_text": args.reference_text, "speaker": args.speaker,
                 "base": args.base}
    # events go through the CLI's own writer: with --json that is the reserved
    # stdout stream, which library prints cannot corrupt
    served = serve(sys.stdin, emitter.callback, device=args.device, dtype=args.dtype,
                   first_load=first)
    return {"served": served, "summary": f"Served {served} request(s)."}


def _add_controls(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speech controls (default: the model's own settings)")
    g.add_argument("--seed", type=int, help="base seed (chunk i uses seed+i); default random")
    g.add_argument("--temperature", type=float, help="randomness, e.g. 0.9; lower is steadier")
    g.add_argument("--top-k", type=int, help="sample among the k most likely codes (0: all)")
    g.add_argument("--top-p", type=float, help="nucleus sampling threshold (1: off)")
    g.add_argument("--repetition-penalty", type=float, help="> 1 discourages droning (1.05)")
    g.add_argument("--greedy", action="store_true",
                   help="no sampling: always the most likely code (deterministic)")
    g.add_argument("--language", default="auto",
                   help="language when the model supports it (default auto)")
    g.add_argument("--chunk-chars", type=int, default=220,
                   help="characters per chunk of long text (default 220)")
    g.add_argument("--max-frames", type=int,
                   help="cap on frames per chunk (12.5 per second); default from text length")
    g.add_argument("--batch-size", type=int, default=8,
                   help="chunks generated together (default 8)")
    g.add_argument("--loudness", type=float, default=-20.0,
                   help="output loudness in LUFS (default -20)")
    g.add_argument("--no-loudness", action="store_true", help="leave the level as generated")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: GPU if present)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="weight precision (auto: bf16 on GPUs and bf16-capable CPUs)")
    p.add_argument("--base", help="base model for a run checkpoint (default: the run's own)")


def register(sub: Any) -> None:
    p = add_command(sub, "speak", _speak, "speak text in a voice and write an audio file")
    p.add_argument("model", metavar="MODEL_OR_VOICE",
                   help="exported voice, voice folder, run folder, checkpoint or base model")
    p.add_argument("text", nargs="?", help="the text; - reads stdin")
    p.add_argument("-o", "--output", required=True,
                   help="output file (.wav, .flac, .ogg, .opus, .mp3)")
    p.add_argument("--text-file", help="read the text from this UTF-8 file")
    p.add_argument("--reference", help="reference clip: zero-shot preview with a base model")
    p.add_argument("--reference-text", help="what is said in the reference clip: in-context "
                   "cloning (default: the voice's own transcript of that clip, if any)")
    p.add_argument("--x-vector-only", action="store_true",
                   help="clone from the reference clip's speaker vector alone")
    p.add_argument("--instruct", help="style instruction, for models that take one "
                   "(1.7B CustomVoice); says so when it has no effect")
    p.add_argument("--checkpoint", help="checkpoint of the run: name, step or 'latest'")
    p.add_argument("--speaker", help="speaker name when the model has several")
    p.add_argument("--format", choices=FORMATS,
                   help="audio format (default: from the file name, else wav)")
    p.add_argument("--stream", action="store_true",
                   help="also write each chunk as OUT.partNN.wav as soon as it is ready")
    _add_controls(p)

    p = add_command(sub, "compare", _compare,
                    "render the same sentences from several checkpoints into an A/B folder")
    p.add_argument("target", metavar="VOICE_OR_RUN")
    p.add_argument("out_dir", metavar="OUT_DIR")
    p.add_argument("--checkpoints", nargs="+", metavar="CKPT",
                   help="checkpoint names or steps (default: all of the run)")
    p.add_argument("--sentences", nargs="+", metavar="TEXT", help="sentences to render")
    p.add_argument("--sentences-file", help="one sentence per line")
    p.add_argument("--reference", help="reference clip for the zero-shot column "
                   "(default: the voice's longest prepared clip)")
    p.add_argument("--no-zero-shot", action="store_true", help="leave out the zero-shot column")
    _add_controls(p)

    p = add_command(sub, "serve-speech", _serve,
                    "keep a voice loaded and serve JSON-line speak requests on stdin")
    p.add_argument("model", nargs="?", metavar="MODEL_OR_VOICE", help="voice to load at start")
    p.add_argument("--checkpoint")
    p.add_argument("--reference")
    p.add_argument("--reference-text")
    p.add_argument("--speaker")
    p.add_argument("--device")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    p.add_argument("--base")
