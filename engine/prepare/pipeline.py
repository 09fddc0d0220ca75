"""Prepare: raw takes -> 24 kHz mono, loudness-normalised, trimmed, sliced clips + reports.

Writes, in `<voice>/prepared/`:
- `clips/<clip>.wav`  24 kHz mono PCM_16
- `manifest.jsonl`    one clip per line: id, path (relative to the voice), text,
                      duration_s, sample_rate, usable, issues, source_take
- `report.json`       the voice-level quality report; `report.txt` the same for people
- `cache/<take>.json` what each take produced, keyed by a hash of its bytes, its
                      text and the settings: an unchanged take is not decoded again

Every take is handled on its own: a file that cannot be used becomes one line
in the report (`rejected`) and the batch goes on.

What a prepare makes is staged (`prepared/staging/`) and moved into place only at
the end, so a prepare that would leave nothing to train on where the voice has
usable clips now (every take left out, every take rejected) raises an InputError
and leaves `prepared/` as it was; a cancelled one keeps its finished takes staged
for the next run. A clip that Listen, a run's speaker or a run's evaluation still
names and that the new set no longer has is named in a warning and in the report.

Here: the run over the takes, each take's clips and metrics, the manifest and report
written. Beside it: `slicing` (a take cut into clips with their texts), `staging` (each
take's cached outcome, the staging folder, the lock), `report` (the report's words) and
`check` (one recording judged in memory, as prepare would).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from engine.audio.checks import (
    BLOCKING,
    NOISY_MARGIN_DB,
    check_clip,
    is_usable,
    issue,
    mark_duplicates,
)
from engine.audio.conditions import Background, background, is_music_bed, slice_snr
from engine.audio.denoise import Denoised, denoise_take
from engine.audio.io import (
    TARGET_SR,
    BadAudioFile,
    DecodeStats,
    decode,
    without_dc,
    write_wav,
)
from engine.audio.loudness import normalize_loudness
from engine.audio.vad import (
    MIN_SPEECH_S,
    VAD_METHODS,
    Levels,
    Slice,
    detect_speech,
    frame_levels,
    merge_by_words,
    snr_db,
    speech_seconds,
)
from engine.config import PrepareConfig
from engine.core.atomic import write_json, write_text
from engine.core.errors import Cancelled, InputError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.layout.manifest import (
    clip_references,
    read_manifest,
    write_manifest,
)
from engine.layout.voice import Take, Voice, now_iso
from engine.model.loading import DEFAULT_BASE_MODEL, resolve_model
from engine.prepare.check import round_finite, slice_facts
from engine.prepare.denoise_judge import Judges, judge_slice, judges_for
from engine.prepare.denoise_judge import describe as describe_denoise
from engine.prepare.report import advice, format_report, say_what_replaces, speaker_report
from engine.prepare.slicing import machine_words, slice_take
from engine.prepare.speakers import ENCODERS, TARGET, ModelEncoder
from engine.prepare.staging import (
    TakeOutcome,
    commit,
    load_cached,
    prepare_lock,
    remove_stale,
    settings_record,
)
from engine.prepare.styles import describe_entries, measure_clip, read_user_styles, voice_styles
from engine.prepare.target import (
    Enrolment,
    Heard,
    apply_decisions,
    hear_speakers,
    read_decisions,
    set_speaker_reference,
    speaker_issues,
)

#: bump when the processing changes so cached results are recomputed
PREPARE_VERSION = 4


def _take_key(take: Take, settings: dict[str, Any]) -> str:
    blob = json.dumps({"v": PREPARE_VERSION, "sha": take.sha256, "bytes": take.bytes,
                       "text": take.text, "settings": settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()



@dataclasses.dataclass
class _TakeSignal:
    """A take's decoded audio and what was heard in it, shared by all its slices."""

    take: Take
    cfg: PrepareConfig
    audio: np.ndarray
    stats: DecodeStats
    levels: Levels
    regions: list[tuple[int, int]]
    words: list[dict[str, Any]] | None
    bg: Background
    take_snr: float
    music: bool
    heard: Heard | None
    den: Denoised | None = None
    judges: Judges | None = None


def _hear_take(take: Take, cfg: PrepareConfig, enrol: Enrolment | None,
               out: TakeOutcome) -> _TakeSignal | None:
    """Decode the take and find its speech, background and speakers; None (with
    `out.rejected` said) for a take that cannot give a clip."""
    try:
        audio, stats = decode(take.audio_path, TARGET_SR,
                              max_seconds=cfg.max_file_minutes * 60.0)
    except BadAudioFile as exc:
        out.rejected = {"code": exc.reason_code, "reason": exc.message}
        return None
    out.audio_s = len(audio) / TARGET_SR
    if stats.non_finite:
        out.rejected = {"code": "non_finite",
                        "reason": f"contains {stats.non_finite} NaN or infinite samples"}
        return None
    audio = without_dc(audio)  # DC offset (reported per clip)
    levels = frame_levels(audio, TARGET_SR)
    regions = detect_speech(audio, TARGET_SR, cfg.vad, levels)
    words = machine_words(take)
    if words:
        # the recogniser's word times overrule a pause the VAD heard inside a word
        regions = merge_by_words(regions, words, TARGET_SR)
    if speech_seconds(regions, TARGET_SR) < MIN_SPEECH_S:
        out.rejected = {"code": "silent",
                        "reason": "contains no speech (silence or steady noise only)"}
        return None
    bg = background(audio, levels, regions)
    heard = None
    if enrol is not None and take.origin != "recorded":
        # a take recorded here is the voice by definition (and part of the enrolment)
        heard = hear_speakers(audio, TARGET_SR, regions, enrol.embedding(), enrol.encoder)
        out.speakers = heard.summary() if heard is not None else None
    return _TakeSignal(take, cfg, audio, stats, levels, regions, words, bg,
                       snr_db(audio, TARGET_SR, levels, regions), is_music_bed(bg), heard)


def _process_take(voice: Voice, take: Take, key: str, cfg: PrepareConfig,
                  enrol: Enrolment | None = None) -> TakeOutcome:
    out = TakeOutcome(take.id, key)
    sig = _hear_take(take, cfg, enrol, out)
    if sig is None:
        return out
    slices, texts, whos, method = slice_take(take, len(sig.audio), sig.regions, sig.words,
                                             sig.heard, cfg)
    if cfg.denoise:
        sig.den = denoise_take(sig.audio, TARGET_SR, sig.levels, sig.regions)
        sig.judges = judges_for(enrol)
    for k, (sl, text, who) in enumerate(zip(slices, texts, whos, strict=True)):
        clip_id = take.id if len(slices) == 1 else f"{take.id}_{k + 1:02d}"
        _prepare_clip(voice, sig, clip_id, sl, (text, who, method), out)
    return out


def _clean_slice(sig: _TakeSignal, sl: Slice, text: str, who: str
                 ) -> tuple[np.ndarray, float, dict[str, Any] | None]:
    """The slice's samples and SNR, denoised where a noisy target slice gains by it
    (the judges decide); the judgement, or None where none was asked."""
    seg = sig.audio[sl.start:sl.end]
    snr = slice_snr(sig.levels, sl.regions, sig.bg.noise_power)
    if (sig.den is None or sig.judges is None or who != TARGET
            or snr >= sig.cfg.min_snr_db + NOISY_MARGIN_DB):
        return seg, snr, None
    cleaned = judge_slice(sig.audio, sig.den, sig.levels, sig.bg.noise_power, sl, TARGET_SR,
                          text, sig.judges)
    if cleaned["applied"]:
        seg = sig.den.audio[sl.start:sl.end]
        snr = float(cleaned["snr_db"][1])
    return seg, snr, cleaned


def _prepare_clip(voice: Voice, sig: _TakeSignal, clip_id: str, sl: Slice,
                  said: tuple[str, str, str], out: TakeOutcome) -> None:
    """One slice as a staged clip, its manifest entry and its metrics row.
    `said`: the slice's text, its speaker and how the text was found."""
    text, who, method = said
    cfg, take, bg = sig.cfg, sig.take, sig.bg
    seg, snr, cleaned = _clean_slice(sig, sl, text, who)
    # how it is spoken, before normalising takes its loudness away
    style = measure_clip(seg, TARGET_SR, text).to_dict()
    norm = normalize_loudness(seg, TARGET_SR, cfg.target_lufs, cfg.peak_dbfs)
    shortfall = ((cfg.target_lufs - norm.loudness_after)
                 if math.isfinite(norm.loudness_after) else 0.0)
    facts = slice_facts(sl, sig.stats, sig.levels, bg, text=text, text_method=method,
                        gain_shortfall_db=shortfall, snr=snr)
    issues = check_clip(facts, cfg)
    speaker = sig.heard.judge(sl, who) if sig.heard is not None else None
    if speaker is not None:
        issues = speaker_issues(speaker, sig.heard.source) + issues
    if cleaned is not None and cleaned["applied"]:
        issues.append(issue("denoised", "Denoised: " + describe_denoise(cleaned) + "."))
    # staged: moved into clips/ only when the whole prepare is kept
    write_wav(voice.prepared.staged_clip(clip_id), norm.audio, TARGET_SR, "PCM_16")
    out.entries.append({
        "id": clip_id, "path": voice.prepared.clip_entry(clip_id), "text": text,
        "duration_s": round(len(seg) / TARGET_SR, 3), "sample_rate": TARGET_SR,
        "usable": is_usable(issues), "issues": issues, "source_take": take.id,
    })
    out.metrics.append({
        "id": clip_id, "source_take": take.id, "start_s": round(sl.start / TARGET_SR, 3),
        "end_s": round(sl.end / TARGET_SR, 3), "speech_s": round(sl.speech_s, 3),
        "loudness_in_lufs": round_finite(norm.loudness_before),
        "loudness_lufs": round_finite(norm.loudness_after),
        "gain_db": round_finite(norm.gain_db), "peak_limited": norm.peak_limited,
        "snr_db": round_finite(snr), "take_snr_db": round_finite(sig.take_snr),
        "rt60_s": None if bg.rt60_s is None else round(bg.rt60_s, 2),
        "pause_flatness": None if bg.flatness is None else round(bg.flatness, 3),
        "music_bed": sig.music, "clipped_samples": facts.clipped_samples,
        "text_method": method, "style": style,
        **({"speaker": speaker} if speaker is not None else {}),
        **({"denoise": cleaned} if cleaned is not None else {}),
    })




def prepare(voice: Voice, on_event: EventCallback | Emitter | None = None,  # noqa: PLR0913
            cancel: Any = None, speakers: str = "auto",
            speaker_reference: str | os.PathLike[str] | None = None,
            denoise: bool | None = None, vad: str | None = None,
            speaker_encoder: str = "resemblyzer",
            base_model: str | os.PathLike[str] | None = None,
            settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Prepare every take of `voice`; returns the voice report (also in report.json).

    `cancel`: optional callable returning True when the user asked to stop.
    `speakers`: "auto" keeps only the voice's own speaker in imported takes
    (enrolled from `speaker_reference`, a clip kept in the voice for later runs,
    else from the voice's recorded takes, else the dominant speaker of each
    recording); "off" keeps every voice.
    `speaker_reference`: a clip of the target speaker alone.
    `denoise`: denoise noisy slices (noisereduce), each only where its SNR, speaker
    similarity and recognised words do not get worse (engine/prepare/denoise_judge.py).
    `vad`: "silero" or the "energy" fallback (engine/audio/vad.py). `denoise` and
    `vad` (None: as the voice's [prepare] settings, `PrepareConfig`, say) override
    the voice's settings for this run, as does each of `settings` ({field: value} of
    `PrepareConfig`, e.g. {"target_lufs": -20}); the voice's voice.toml is not changed.
    `speaker_encoder`: the embedding that decides who speaks: "resemblyzer" (the
    default) or "model", the speaker encoder of the Qwen3-TTS Base model `base_model`
    (a folder or a hub id already on this machine; default the standard Base model).
    """
    if vad is not None and vad not in VAD_METHODS:
        raise InputError(f"Unknown voice activity detector {vad!r}.",
                         f"Use one of: {', '.join(VAD_METHODS)}.")
    given = {**(settings or {}), **({} if denoise is None else {"denoise": denoise}),
             **({} if vad is None else {"vad": vad})}
    cfg = voice.prepare_config_with(given)  # refused before anything is written
    if speakers not in ("auto", "off"):
        raise InputError(f"Unknown speakers mode {speakers!r}.", "Use 'auto' or 'off'.")
    _refuse_without_takes(voice)  # before anything is written
    encoder = _speaker_encoder(speaker_encoder, base_model) if speakers == "auto" else None
    if speaker_reference is not None:
        set_speaker_reference(voice, Path(speaker_reference))
    with prepare_lock(voice.prepared):
        return _prepare(voice, on_event, cancel, cfg, speakers, encoder)


def _refuse_without_takes(voice: Voice) -> None:
    """No take in use: a prepare could only empty the prepared set."""
    takes = voice.list_takes()
    if not takes:
        raise InputError("The voice has no takes to prepare, so nothing was changed.",
                         "Record or import speech first.")
    if all((t.extra or {}).get("excluded") for t in takes):
        raise InputError(f"Every take ({len(takes)}) is left out, so prepare would leave "
                         "nothing to train on; nothing was changed.",
                         "Tick the takes to use in the Use column of the Import page, "
                         "then prepare again.")


def _speaker_encoder(name: str, base_model: str | os.PathLike[str] | None) -> Any:
    """None for resemblyzer, else the Base model's own speaker encoder, loaded alone."""
    if name not in ENCODERS:
        raise InputError(f"Unknown speaker encoder {name!r}.",
                         f"Use one of: {', '.join(ENCODERS)}.")
    if name == "resemblyzer":
        return None

    # never a download here: preparing must not fetch gigabytes for a 12M encoder
    return ModelEncoder(resolve_model(base_model or DEFAULT_BASE_MODEL, download=False))


def _prepare(voice: Voice, on_event: EventCallback | Emitter | None, cancel: Any,
             cfg: PrepareConfig, speakers: str = "auto", encoder: Any = None
             ) -> dict[str, Any]:
    em = as_emitter(on_event)
    t0 = time.perf_counter()
    takes = voice.list_takes()
    enrol = Enrolment(voice, takes, encoder) if speakers == "auto" else None
    settings = settings_record(cfg, enrol.key if enrol is not None else "off")
    prepared = voice.prepared
    em.state("preparing", detail=f"{len(takes)} takes")
    work = _Work(voice, cfg, settings, enrol)
    for i, take in enumerate(takes):
        if cancel is not None and cancel():
            raise Cancelled("Prepare was cancelled; finished takes are kept for next time.")
        em.progress("prepare", i, len(takes), take=take.id)
        outcome = work.take(take)
        if outcome.rejected and outcome.rejected["code"] != "excluded":
            em.log(f"{take.id} ({take.source or take.audio_path.name}) "
                   f"{outcome.rejected['reason']}; skipped.", level="warning",
                   take=take.id, code=outcome.rejected["code"])
    em.progress("prepare", len(takes), len(takes))
    outcomes = work.outcomes
    entries = _entries(voice, outcomes)
    base = describe_entries(entries, {m["id"]: m["style"] for o in outcomes for m in o.metrics
                                      if isinstance(m.get("style"), dict)},
                            {t.id: str(t.extra.get("style") or "") for t in takes},
                            read_user_styles(voice.path))
    _refuse_to_empty(voice, entries, outcomes)
    removed = _removed_references(voice, entries)
    commit(prepared, work.staged)
    remove_stale(prepared, {t.id for t in takes}, outcomes)
    report = _write_outputs(voice, takes, outcomes, entries, settings, removed)
    report["style_baseline"] = base.to_dict()
    write_json(voice.prepared.report, report)
    voice.set_styles(voice_styles(entries))
    for r in report["removed_references"]:
        em.log(r["message"], level="warning", clip=r["clip"])
    wall = time.perf_counter() - t0
    report["run"] = {"takes_processed": len(takes) - work.reused, "takes_reused": work.reused,
                     "audio_s_processed": round(work.audio_s, 3),
                     "wall_s": round(wall, 3)}
    em.artifact(str(prepared.manifest), "manifest")
    em.artifact(str(prepared.report), "report")
    return report


class _Work:
    """Each take's outcome: from the cache, from a cancelled prepare's staging, or made
    now into the staging folder (`staged`: the takes whose clips wait there)."""

    def __init__(self, voice: Voice, cfg: PrepareConfig, settings: dict[str, Any],
                 enrol: Enrolment | None) -> None:
        self.voice, self.cfg, self.settings, self.enrol = voice, cfg, settings, enrol
        self.outcomes: list[TakeOutcome] = []
        self.staged: dict[str, TakeOutcome] = {}
        self.reused = 0
        self.audio_s = 0.0

    def take(self, take: Take) -> TakeOutcome:
        outcome = self._outcome(take)
        self.outcomes.append(outcome)
        return outcome

    def _outcome(self, take: Take) -> TakeOutcome:
        if (take.extra or {}).get("excluded"):
            return TakeOutcome(take.id, "", rejected={
                "code": "excluded", "reason": "is excluded (include it again to use it)"})
        prepared = self.voice.prepared
        key = _take_key(take, self.settings)
        outcome = load_cached(prepared.cache_dir / f"{take.id}.json", key, prepared.clip_file)
        if outcome is not None:
            self.reused += 1
            return outcome
        staged = prepared.staged_cache(take.id)
        outcome = load_cached(staged, key, prepared.staged_clip)  # a cancelled prepare's
        if outcome is not None:
            self.reused += 1
        else:
            prepared.staged_clip(take.id).parent.mkdir(parents=True, exist_ok=True)
            try:
                outcome = _process_take(self.voice, take, key, self.cfg, self.enrol)
            except MemoryError:
                outcome = TakeOutcome(take.id, key, rejected={
                    "code": "too_large", "reason": "is too large to process in memory"})
            self.audio_s += outcome.audio_s
            write_json(staged, outcome.to_dict())
        self.staged[take.id] = outcome
        return outcome


def _entries(voice: Voice, outcomes: list[TakeOutcome]) -> list[dict[str, Any]]:
    """The manifest rows the outcomes make, with the user's decisions and the final verdicts."""
    entries = [json.loads(json.dumps(e)) for o in outcomes for e in o.entries]
    apply_decisions(entries, read_decisions(voice))
    mark_duplicates(entries)
    for e in entries:
        e["usable"] = is_usable(e["issues"])
    return entries


def _refuse_to_empty(voice: Voice, entries: list[dict[str, Any]],
                     outcomes: list[TakeOutcome]) -> None:
    """Raise, leaving `prepared/` as it was, when the new set has no usable clip and the
    current one has some (a first prepare still writes its report: nothing is lost)."""
    if any(e["usable"] for e in entries):
        return
    kept = read_manifest(voice.path, strict=False)
    if not kept:
        return
    shutil.rmtree(voice.prepared.staging_dir, ignore_errors=True)
    why = Counter(o.rejected["code"] for o in outcomes
                  if o.rejected and o.rejected["code"] != "excluded")
    why.update(next(i["code"] for i in e["issues"] if i["code"] in BLOCKING) for e in entries)
    in_use = sum(1 for o in outcomes if not (o.rejected or {}).get("code") == "excluded")
    reasons = ", ".join(f"{n} {code.replace('_', ' ')}" for code, n in why.most_common())
    raise InputError(f"None of the {in_use} takes in use gave a usable clip ({reasons}), "
                     f"so the {len(kept)} usable prepared clips were left as they were.",
                     "Fix or replace those takes (the log names each one's problem), "
                     "then prepare again.")


def _removed_references(voice: Voice, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The clips that something still names and the new set no longer has."""
    keep = {str(e["id"]) for e in entries}
    return [{"clip": clip, "used_by": who}
            for clip, who in sorted(clip_references(voice.path).items()) if clip not in keep]



def _write_outputs(voice: Voice, takes: list[Take], outcomes: list[TakeOutcome],
                   entries: list[dict[str, Any]], settings: dict[str, Any],
                   removed: list[dict[str, Any]]) -> dict[str, Any]:
    metrics = {m["id"]: m for o in outcomes for m in o.metrics}
    source = {t.id: t.source or t.audio_path.name for t in takes}
    rejected = [{"take": o.take_id, "source": source.get(o.take_id, ""), **o.rejected}
                for o in outcomes if o.rejected]
    rejected += [{"take": p["take"], "source": p["take"], "code": p["code"],
                  "reason": p["reason"]} for p in voice.problems()]
    total_s = sum(e["duration_s"] for e in entries)
    usable_s = sum(e["duration_s"] for e in entries if e["usable"])
    rec_min = float(settings["recommended_minutes"])
    issues_by_code = Counter(i["code"] for e in entries for i in e["issues"])
    unusable_by = Counter(next(i["code"] for i in e["issues"] if i["code"] in BLOCKING)
                          for e in entries if not e["usable"])
    totals = {
        "takes": len(takes) + len(voice.problems()),
        "prepared_takes": sum(1 for o in outcomes if not o.rejected),
        "rejected_takes": len(rejected),
        "clips": len(entries),
        "usable_clips": sum(1 for e in entries if e["usable"]),
        "minutes_recorded": round(sum(t.duration_s or 0.0 for t in takes) / 60.0, 3),
        "minutes_total": round(total_s / 60.0, 3),
        "minutes_usable": round(usable_s / 60.0, 3),
        "recommended_minutes": rec_min,
        "percent_of_recommendation": round(100.0 * usable_s / 60.0 / rec_min, 1),
        "enough": usable_s / 60.0 >= rec_min,
    }
    report: dict[str, Any] = {
        "voice": voice.speaker, "created": now_iso(), "version": PREPARE_VERSION,
        "sample_rate": TARGET_SR, "settings": settings, "totals": totals,
        "rejects_by_reason": dict(Counter(r["code"] for r in rejected)),
        "unusable_by_reason": dict(unusable_by), "issues_by_code": dict(issues_by_code),
        "rejected": rejected,
        "clips": [{**metrics.get(e["id"], {}), "text": e["text"],
                   "duration_s": e["duration_s"], "usable": e["usable"],
                   "issues": e["issues"]} for e in entries],
        "take_hashes": sorted(t.sha256 for t in takes),
        # what each take in use was when judged (engine.layout.manifest.SpeechCount)
        "takes_in_use": {t.id: t.sha256 for t in takes if not (t.extra or {}).get("excluded")},
        "removed_references": removed,
        "speakers": speaker_report(settings, outcomes, entries),
    }
    say_what_replaces(voice, removed, entries, report)
    report["advice"] = advice(report) + [r["message"] for r in removed]
    write_manifest(voice.path, entries)
    write_json(voice.prepared.report, report)
    write_text(voice.prepared.report_text, format_report(report))
    return report
