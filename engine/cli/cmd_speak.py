"""CLI: `speak`, `compare` (checkpoint A/B folder) and `serve-speech` (warm worker)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from engine.cli.main import add_command
from engine.cli.settings import FIELD, add_field
from engine.config.schema import lookup
from engine.config.serve import ServeSettings
from engine.config.speak import DTYPES, FORMATS, QUANT_MODES, SPEAK_SETTINGS
from engine.core.errors import InputError
from engine.core.events import Emitter


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
    """The `SpeakOptions` parsed `speak` or `compare` flags give (the window's Listen page
    sends the same settings by the same flags)."""
    from engine.config.speak import SpeakOptions

    # a setting not given stays the option's own default (SpeakOptions holds them)
    values = {name: getattr(args, name) for name in _CONTROLS if getattr(args, name) is not None}
    if args.no_loudness:
        values["loudness_lufs"] = None
    if args.greedy:
        values["do_sample"] = False
        values["subtalker_do_sample"] = False
    return SpeakOptions(**values)


def _speak(args: argparse.Namespace, emitter: Emitter) -> dict[str, Any]:
    from engine.config.speak import audio_format
    from engine.synth.runaway import cut_reasons
    from engine.synth.synthesizer import Synthesizer
    from engine.synth.voice import resolve_source
    from engine.text import split_text

    text = _read_text(args)
    options = _options(args)
    to_pipe = args.output == "-"
    if args.output is None and not args.play:
        raise InputError("No output was given.",
                         "Write a file with -o OUT.wav, raw audio with -o -, or play it with "
                         "--play.")
    if to_pipe and getattr(args, "json", False):
        raise InputError("-o - writes raw audio to standard output, which --json uses for "
                         "events.", "Drop --json, or write a file.")
    if to_pipe and args.text == "-":
        raise InputError("The text comes from standard input and the audio goes to standard "
                         "output: give the text as an argument or with --text-file.")
    fmt = audio_format(args.output, args.format) if args.output and not to_pipe else None
    # Check the text and voice before the (slow) model load, so mistakes fail fast.
    split_text(text, options.chunk_chars)
    source = resolve_source(args.model, checkpoint=args.checkpoint, reference=args.reference,
                            speaker=args.speaker, base=args.base,
                            reference_text=args.reference_text,
                            x_vector_only=args.x_vector_only)
    player = None
    if args.play:
        from engine.synth.stream import Player

        player = Player()  # no sound device: fail before the model load
    synth = Synthesizer.load(source, device=args.device, dtype=args.dtype, on_event=emitter,
                             quantize=args.quantize, fuse=args.fuse)
    if args.output and not to_pipe:
        result = synth.speak_to_file(text, args.output, options, fmt, emitter,
                                     stream=args.stream, play=player)
        where = f"Wrote {result['path']}"
    else:
        result = _speak_to_stream(synth, text, options, emitter, player, to_pipe)
        where = "Streamed raw 16-bit 24 kHz mono audio" if to_pipe else "Played"
    first = result.get("first_audio_s")
    result["runaway"] = cut_reasons(result["chunks"])
    cut = [c for c in result["chunks"] if c.get("runaway")]
    result["summary"] = (f"{where} ({result['duration_s']:.1f} s of audio in "
                         f"{result['compute_s']:.1f} s, {result['rtf']:.2f}x real time"
                         + (f", first audio after {first:.2f} s" if first is not None else "")
                         + f", seed {result['seed']}, voice {source.label})"
                         + (f"; {len(cut)} chunk(s) cut by the runaway guard "
                            f"({', '.join(result['runaway'])})" if cut else ""))
    return result


def _speak_to_stream(synth: Any, text: str, options: Any, emitter: Emitter, player: Any,
                     to_pipe: bool) -> dict[str, Any]:
    from engine.cli.main import private_stdout
    from engine.synth.stream import RawPcm

    # the audio owns the real stdout; prints (and the summary) go to stderr
    pipe = private_stdout() if to_pipe else None  # held: dropping it closes the fd
    sinks = ([RawPcm(pipe.buffer)] if pipe is not None else []) + ([player] if player else [])

    class _Tee:
        def write(self, audio: Any) -> None:
            for sink in sinks:
                sink.write(audio)

    if player is not None:
        from engine.synth.stream import expected_speech_s
        from engine.text import split_text

        player.expect(expected_speech_s(split_text(text, options.chunk_chars)))
    try:
        speech = synth.speak_stream(text, _Tee(), options, emitter)
    finally:
        for sink in sinks:
            sink.close()
    playback = player.stats() if player is not None else None
    if playback is not None:  # the jitter buffer's report (--json: a metric event)
        emitter.metric({f"play/{k}": v for k, v in playback.items() if v is not None})
    return {"playback": playback,
            "path": "-" if to_pipe else None, "format": "s16le" if to_pipe else None,
            "sample_rate": speech.sample_rate, "duration_s": round(speech.duration_s, 3),
            "compute_s": round(speech.compute_s, 3), "rtf": round(speech.rtf, 3),
            "first_audio_s": (None if speech.first_audio_s is None
                              else round(speech.first_audio_s, 3)),
            "seed": speech.seed, "chunks": speech.chunks, "cancelled": speech.cancelled,
            "voice": synth.source.to_dict()}


def _compare(args: argparse.Namespace, emitter: Emitter) -> dict[str, Any]:
    from engine.quality.compare import CompareRequest, compare

    sentences = list(args.sentences or [])
    if args.sentences_file:
        path = Path(args.sentences_file).expanduser()
        if not path.is_file():
            raise InputError(f"The sentences file {path} does not exist.")
        sentences += [line for line in path.read_text(encoding="utf-8").splitlines()
                      if line.strip()]
    options = _options(args)
    request = CompareRequest(args.target, args.out_dir, sentences or None,
                             args.checkpoints or None, options=options,
                             zero_shot=not args.no_zero_shot, reference=args.reference,
                             base=args.base, device=args.device, dtype=args.dtype,
                             quantize=args.quantize, fuse=args.fuse)
    return compare(request, emitter)


def _serve(args: argparse.Namespace, emitter: Emitter) -> dict[str, Any]:
    from engine.synth.worker import serve

    first = None
    if args.model:
        first = {"op": "load", "id": "initial", "voice": args.model,
                 "checkpoint": args.checkpoint, "reference": args.reference,
                 "reference_text": args.reference_text, "speaker": args.speaker,
                 "base": args.base}
    # events go through the CLI's own writer: with --json that is the reserved
    # stdout stream, which library prints cannot corrupt
    served = serve(sys.stdin, emitter.callback, device=args.device, dtype=args.dtype,
                   first_load=first, watch_parent=True, rows=args.rows,
                   quantize=args.quantize, fuse=args.fuse)
    return {"served": served, "summary": f"Served {served} request(s)."}


#: the speaking settings taken as flags, by field name (`SPEAK_SETTINGS`)
_CONTROLS = tuple(path.rpartition(".")[2] for path in SPEAK_SETTINGS)


def _add_controls(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speech controls (default: the model's own settings)")
    for path in SPEAK_SETTINGS:
        add_field(g, *lookup(path))
    g.add_argument("--greedy", action="store_true",
                   help="no sampling: always the most likely code (deterministic)")
    g.add_argument("--no-loudness", action="store_true", help="leave the level as generated")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: GPU if present)")
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="weight precision (auto: bf16 on GPUs and bf16-capable CPUs)")
    p.add_argument("--base", help="base model for a run checkpoint (default: the run's own)")
    _add_speed(p)


def _add_speed(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("CPU speed options (change the numbers; default: exact)")
    g.add_argument("--quantize", choices=QUANT_MODES,
                   help="packed projections on the CPU (fbgemm), faster, not bit-exact: "
                        "int8 (fastest) or fp16 weights (closest to the exact numbers)")
    g.add_argument("--fuse", action="store_true",
                   help="fused q/k/v and gate/up projections (one weight pass each)")


def register(sub: Any) -> None:
    p = add_command(sub, "speak", _speak, "speak text in a voice and write an audio file")
    p.add_argument("model", metavar="MODEL_OR_VOICE",
                   help="exported voice, voice folder, run folder, checkpoint or base model")
    p.add_argument("text", nargs="?", help="the text; - reads stdin")
    p.add_argument("-o", "--output",
                   help="output file (.wav, .flac, .ogg, .opus, .mp3); - writes raw 16-bit "
                   "24 kHz mono PCM to standard output as it is generated")
    p.add_argument("--text-file", help="read the text from this UTF-8 file")
    p.add_argument("--reference", help="reference clip: zero-shot preview with a base model")
    p.add_argument("--reference-text", help="what is said in the reference clip: in-context "
                   "cloning (default: the voice's own transcript of that clip, if any)")
    p.add_argument("--x-vector-only", action="store_true",
                   help="clone from the reference clip's speaker vector alone")
    p.add_argument("--checkpoint", help="checkpoint of the run: name, step or 'latest'")
    p.add_argument("--speaker", help="speaker name when the model has several")
    p.add_argument("--format", choices=FORMATS,
                   help="audio format (default: from the file name, else wav)")
    p.add_argument("--stream", action="store_true",
                   help="write OUT as the audio is generated (it grows; at the end it holds "
                   "the finished render)")
    p.add_argument("--play", action="store_true",
                   help="play on the sound device as it is generated")
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
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--base")
    add_field(p, ServeSettings, "rows", default=FIELD)
    _add_speed(p)
