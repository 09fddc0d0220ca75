"""CLI: the voice workspace, prompts, import and prepare.

    voxshard-engine voice new PATH --speaker NAME [--language LANG]
    voxshard-engine voice list VOICE
    voxshard-engine voice delete-take VOICE ID
    voxshard-engine voice info VOICE
    voxshard-engine voice instant VOICE [--base MODEL]
    voxshard-engine voice tiers VOICE
    voxshard-engine voice styles VOICE
    voxshard-engine voice style VOICE CLIP [TEXT | --measured]
    voxshard-engine prompts next VOICE [--count N] [--set NAME]
    voxshard-engine import VOICE FILES_OR_FOLDERS... [--transcripts FILE]
    voxshard-engine prepare VOICE [--target-lufs L ...] [--save-settings]

Each handler is a thin layer over the engine API and returns the result dict;
its "summary" is what a person sees.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any

from engine.catalog import list_tiers
from engine.cli.main import add_command
from engine.cli.settings import add_field
from engine.config import PrepareConfig
from engine.core.errors import AudioError, InputError, VoxshardError
from engine.core.events import Emitter
from engine.layout.manifest import read_manifest
from engine.layout.voice import create_voice, open_voice
from engine.layout.voice_prompts import next_prompts, prompt_progress
from engine.prepare.styles import set_clip_style


def _voice_new(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    voice = create_voice(args.path, args.speaker, args.language)
    em.artifact(str(voice.voice_file), "voice")
    return {"voice": str(voice.path), "speaker": voice.speaker, "language": voice.language,
            "summary": f"Created voice '{voice.speaker}' ({voice.language}) at {voice.path}."}


def _voice_list(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    voice = open_voice(args.voice)
    takes = voice.list_takes()
    rows = [t.to_dict() for t in takes]
    lines = [f"{len(takes)} take(s) in '{voice.speaker}':"]
    for t in takes:
        dur = f"{t.duration_s:6.2f}s" if t.duration_s is not None else "     ?"
        text = t.text if len(t.text) <= 60 else t.text[:57] + "..."
        lines.append(f"  {t.id:<24} {dur}  {text or '(no transcript)'}")
    for p in voice.problems():
        lines.append(f"  {p['take']:<24} damaged: {p['reason']}")
    return {"takes": rows, "problems": voice.problems(), "summary": "\n".join(lines)}


def _voice_delete(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    voice = open_voice(args.voice)
    take = voice.delete_take(args.take_id)
    return {"deleted": take.id, "summary": f"Deleted take {take.id}."}


def _voice_info(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    voice = open_voice(args.voice)
    info = voice.summary()
    try:
        info["prompts"] = prompt_progress(voice)
    except InputError:
        info["prompts"] = None
    lines = [
        f"Voice '{info['display_name']}' (speaker key '{info['speaker']}', {info['language']})",
        f"  folder     {info['path']}",
        f"  takes      {info['takes']} ({info['recorded']} recorded, {info['imported']} "
        f"imported, {info['without_text']} without transcript)",
        f"  recorded   {info['minutes_recorded']:.2f} min "
        f"(recommended {info['recommended_minutes']:g})",
    ]
    prep = info["prepared"]
    if prep and not prep.get("damaged"):
        stale = " (out of date: run prepare)" if prep["stale"] else ""
        lines.append(f"  usable     {prep['minutes_usable']:.2f} min in {prep['usable_clips']}"
                     f"/{prep['clips']} clips{stale}")
    else:
        lines.append("  usable     not prepared yet")
    if info["prompts"]:
        pp = info["prompts"]
        lines.append(f"  prompts    {pp['recorded']}/{pp['total']} of set '{pp['set']}' recorded")
    for p in info["problems"]:
        lines.append(f"  problem    {p['take']}: {p['reason']}")
    lines.append(info["verdict"])
    info["summary"] = "\n".join(lines)
    return info


def _prompts_next(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    voice = open_voice(args.voice)
    if args.count < 1:
        raise InputError("--count must be at least 1.")
    found = next_prompts(voice, args.count, args.set)
    if not found:
        return {"prompts": [], "summary": "Every prompt of the set is recorded."}
    lines = [f"{p.id}  {p.text}" for p in found]
    return {"prompts": [p.to_dict() for p in found], "summary": "\n".join(lines)}


def _import(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    from engine.prepare.importer import import_files

    voice = open_voice(args.voice)
    if getattr(args, "speaker_reference", None):
        from engine.prepare.target import set_speaker_reference

        set_speaker_reference(voice, Path(args.speaker_reference))
    result = import_files(voice, args.paths, transcripts=args.transcripts, on_event=em)
    failed = [s for s in result["skipped"] if s["code"] != "already_imported"]
    if not result["imported"] and not result["skipped"]:
        raise InputError("No WAV, FLAC, OGG or MP3 files were found there.",
                         "Give audio files, or folders that hold them.")
    if not result["imported"] and failed:
        # nothing usable at all is a failure the exit code must show (a re-import is not)
        # every file's own reason: the second file's was hidden behind "(and 1 more)"
        raise AudioError("Nothing was imported: " + "; ".join(
            f"{s['path']} {s['reason']}" for s in failed) + ".",
            "Give WAV, FLAC, OGG or MP3 files or folders holding them.")
    return result


def _prepare(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    from engine.prepare.pipeline import prepare
    from engine.prepare.report import format_report

    voice = open_voice(args.voice)
    if not voice.list_takes() and not voice.problems():
        raise InputError(f"The voice at {voice.path} has no takes yet.",
                         "Record some, or add files with `voxshard-engine import`.")
    given = {f.name: getattr(args, f.name) for f in fields(PrepareConfig)
             if getattr(args, f.name) is not None}
    if args.save_settings and given:
        voice.update_settings(**given)
        em.log("Kept as the voice's prepare settings: " + ", ".join(
            f"{name} {value}" for name, value in given.items()) + ".")
    report = prepare(voice, on_event=em, speakers=args.speakers,
                     speaker_reference=args.speaker_reference, settings=given,
                     speaker_encoder=args.speaker_encoder, base_model=args.base)
    instant = _save_instant(voice.path, args.base, em)
    return {"report": str(voice.prepared.report), "manifest": str(voice.prepared.manifest),
            "instant": instant, "totals": report["totals"],
            "rejects_by_reason": report["rejects_by_reason"],
            "unusable_by_reason": report["unusable_by_reason"], "run": report["run"],
            "summary": format_report(report).rstrip()}


def _save_instant(voice: Path, base: str | None, em: Emitter) -> str | None:
    """After a prepare: the voice's instant voice, so it speaks at once (a voice that
    cannot have one yet, no transcribed clip, is said in a warning, not a failure)."""
    from engine.prepare.instant import make_instant_voice

    try:
        return str(make_instant_voice(voice, base).folder)
    except VoxshardError as exc:
        em.log(f"No instant voice yet: {exc.message}", level="warning")
        return None


def _voice_instant(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    from engine.prepare.instant import make_instant_voice

    instant = make_instant_voice(args.voice, args.base, download=True)
    em.artifact(str(instant.folder), "instant_voice")
    vec = "with" if instant.x_vector_file.is_file() else "without"
    return {"instant": str(instant.folder), "clip": instant.clip_id, "text": instant.text,
            "base": instant.base,
            "summary": f"Saved the instant voice of '{instant.speaker}' ({vec} its speaker "
                       f"vector) from clip {instant.clip_id} to {instant.folder}."}


def _voice_tiers(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    tiers = list_tiers(args.voice)
    lines = [f"{len(tiers)} way(s) to speak:"] + [
        f"  {t['tier']:<8} {t['name']:<28} {t['size_bytes'] / 1e6:9.1f} MB  "
        f"base {t['base'] or '?'}" for t in tiers]
    return {"tiers": tiers, "summary": "\n".join(lines)}


def _voice_styles(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    voice = open_voice(args.voice)
    rows = read_manifest(voice.path, usable_only=False)
    if not rows:
        raise InputError(f"{voice.display_name} has no prepared clips yet.",
                         f"Run `voxshard-engine prepare {voice.path}` first.")
    clips = [{"id": r["id"], "style": r.get("style", ""), "source": r.get("style_source"),
              "measured": r.get("style_measured", ""), "usable": r.get("usable", True)}
             for r in rows]
    lines = [f"{len(voice.styles)} style(s) in '{voice.speaker}': "
             + ("; ".join(voice.styles) or "none (every clip plain)")]
    for c in clips:
        said = c["style"] or "(plain)"
        lines.append(f"  {c['id']:<24} {said}  [{c['source'] or '?'}]")
    return {"styles": voice.styles, "clips": clips, "summary": "\n".join(lines)}


def _voice_style(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    if (args.text is None) == (not args.measured):
        raise InputError("Give the clip's description, or --measured to go back to the "
                         "measured one.", 'For example: voice style VOICE CLIP "Whisper."')
    style = set_clip_style(args.voice, args.clip, None if args.measured else args.text)
    return {"clip": args.clip, "style": style,
            "summary": f"{args.clip}: {style or '(plain)'}"}


def register(sub: Any) -> None:
    voice = add_command(sub, "voice", None, "Create and inspect a voice workspace.")
    vsub = voice.add_subparsers(dest="voice_command", metavar="ACTION",
                                parser_class=type(voice))
    vsub.required = True

    p = add_command(vsub, "new", _voice_new, "Create a new voice folder.")
    p.add_argument("path", help="folder for the new voice (must not exist or be empty)")
    p.add_argument("--speaker", required=True, help="speaker name (stored lowercase-safe)")
    p.add_argument("--language", default="english", help="language name (default: english)")

    p = add_command(vsub, "list", _voice_list, "List the takes of a voice.")
    p.add_argument("voice", help="voice folder")

    p = add_command(vsub, "delete-take", _voice_delete, "Delete one take (audio and text).")
    p.add_argument("voice", help="voice folder")
    p.add_argument("take_id", metavar="ID", help="take id, or its number")

    p = add_command(vsub, "info", _voice_info, "Show a voice's totals and readiness.")
    p.add_argument("voice", help="voice folder")

    p = add_command(vsub, "instant", _voice_instant,
                    "Save the voice's instant voice (no training) from its prepared clips.")
    p.add_argument("voice", help="voice folder")
    p.add_argument("--base", default=None, metavar="MODEL",
                   help="the Base model it speaks on (default: the one the voice trained from)")

    p = add_command(vsub, "tiers", _voice_tiers,
                    "List what the voice speaks with: instant, adapter and full voices.")
    p.add_argument("voice", help="voice folder")

    p = add_command(vsub, "styles", _voice_styles,
                    "List the voice's styles and each prepared clip's description.")
    p.add_argument("voice", help="voice folder")

    p = add_command(vsub, "style", _voice_style,
                    "Describe how one prepared clip is spoken (it trains with that "
                    "description as its instruction).")
    p.add_argument("voice", help="voice folder")
    p.add_argument("clip", help="prepared clip id (see `voice styles`)")
    p.add_argument("text", nargs="?", default=None,
                   help='the description, e.g. "Whisper, slowly." ("" for no style)')
    p.add_argument("--measured", action="store_true",
                   help="forget your description: use the one measured from the audio")

    prompts = add_command(sub, "prompts", None, "Sentences to read aloud.")
    psub = prompts.add_subparsers(dest="prompts_command", metavar="ACTION",
                                  parser_class=type(prompts))
    psub.required = True
    p = add_command(psub, "next", _prompts_next, "Show the next unrecorded prompt(s).")
    p.add_argument("voice", help="voice folder")
    p.add_argument("--count", type=int, default=1, help="how many prompts (default 1)")
    p.add_argument("--set", default=None, help="prompt set name (default: the voice's)")

    p = add_command(sub, "import", _import,
                    "Copy audio files or folders into a voice, with transcripts.")
    p.add_argument("voice", help="voice folder")
    p.add_argument("paths", nargs="+", metavar="FILES_OR_FOLDERS")
    p.add_argument("--transcripts", default=None, metavar="FILE",
                   help="CSV/TSV/JSONL list (file + text columns) or LJSpeech metadata.csv")
    p.add_argument("--speaker-reference", default=None, metavar="CLIP",
                   help="a clip of the voice's speaker alone: prepare keeps only that speaker")

    p = add_command(sub, "prepare", _prepare,
                    "Make clean 24 kHz clips and a quality report from the takes.")
    p.add_argument("voice", help="voice folder")
    p.add_argument("--speaker-reference", default=None, metavar="CLIP",
                   help="a clip of the voice's speaker alone (kept in the voice for later "
                        "runs); without one, the recorded takes or the dominant speaker")
    p.add_argument("--speakers", choices=("auto", "off"), default="auto",
                   help="auto: leave out other speakers and overlapped voices (default)")
    # each defaults to the voice's [prepare] settings (PrepareConfig)
    for f in fields(PrepareConfig):
        add_field(p, PrepareConfig, f.name)
    p.add_argument("--save-settings", action="store_true",
                   help="keep the settings given here as the voice's own ([prepare] of its "
                        "voice.toml), for later prepares and the window")
    p.add_argument("--speaker-encoder", choices=("resemblyzer", "model"),
                   default="resemblyzer",
                   help="embedding that tells speakers apart: resemblyzer (default) or "
                        "model, the Base model's own speaker encoder (see --base)")
    p.add_argument("--base", default=None, metavar="MODEL",
                   help="Qwen3-TTS Base model (folder, or a hub id already downloaded) "
                        "for --speaker-encoder model")
