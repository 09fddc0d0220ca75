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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.audio.checks import (
    BLOCKING,
    NOISY_MARGIN_DB,
    ClipFacts,
    check_clip,
    is_usable,
    issue,
    mark_duplicates,
)
from engine.audio.conditions import background, is_music_bed, slice_snr
from engine.audio.denoise import denoise_take
from engine.audio.io import TARGET_SR, BadAudioFile, clipped_per_sample, decode, write_wav
from engine.audio.loudness import normalize_loudness
from engine.audio.resample import resample
from engine.audio.vad import (
    MIN_SPEECH_S,
    VAD_METHODS,
    Slice,
    detect_speech,
    frame_levels,
    longest_gaps,
    merge_by_words,
    out_of_words,
    plan_slices,
    slices_at,
    snr_db,
    speech_regions,
    speech_seconds,
)
from engine.config import PrepareConfig
from engine.core.atomic import write_json, write_text
from engine.core.errors import Cancelled, InputError, WorkspaceError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.layout.manifest import (
    LISTEN_REFERENCE,
    PreparedFolder,
    choose_reference,
    clip_references,
    read_manifest,
    write_manifest,
)
from engine.layout.voice import Take, Voice, now_iso
from engine.model.loading import DEFAULT_BASE_MODEL, resolve_model
from engine.prepare.denoise_judge import describe as describe_denoise
from engine.prepare.denoise_judge import judge_slice, judges_for
from engine.prepare.speakers import ENCODERS, TARGET, ModelEncoder
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
from engine.prepare.transcribe import asr_info, is_machine_made
from engine.prepare.transcripts import group_sentences, texts_from_words
from engine.text import split_sentences

#: bump when the processing changes so cached results are recomputed
PREPARE_VERSION = 3
#: how far (relative) a slice's share of the text may stray from its share of speech time
TEXT_TOLERANCE = 0.35
#: looser when the pauses already single out the sentence boundaries
SENTENCE_TOLERANCE = 0.6
#: sentence pauses must be this many times longer than the longest pause inside a sentence
PAUSE_CONTRAST = 1.5


@dataclass
class TakeOutcome:
    take_id: str
    key: str
    entries: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    rejected: dict[str, str] | None = None
    audio_s: float = 0.0
    #: who was heard in the take (engine.prepare.target.Heard.summary), when it was checked
    speakers: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"take_id": self.take_id, "key": self.key, "entries": self.entries,
                "metrics": self.metrics, "rejected": self.rejected, "audio_s": self.audio_s,
                "speakers": self.speakers}


def _settings_record(cfg: PrepareConfig, speakers: str) -> dict[str, Any]:
    """What a take's result depends on, as the cache key and report.json record it.

    `vad` and `denoise` at their defaults are left out, as they were before they
    were config fields, so the caches of voices prepared then stay valid.
    """
    record = cfg.to_dict()
    defaults = PrepareConfig()
    for name in ("vad", "denoise"):
        if record[name] == getattr(defaults, name):
            del record[name]
    # what decides a take's speaker is part of what its cached result depends on
    record["speakers"] = speakers
    return record


def _take_key(take: Take, settings: dict[str, Any]) -> str:
    blob = json.dumps({"v": PREPARE_VERSION, "sha": take.sha256, "bytes": take.bytes,
                       "text": take.text, "settings": settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _pauses_stand_out(regions: list[tuple[int, int]], count: int) -> bool:
    """The `count` longest pauses are clearly longer than every other one."""
    gaps = sorted((regions[i][0] - regions[i - 1][1] for i in range(1, len(regions))),
                  reverse=True)
    if len(gaps) <= count:
        return True
    return gaps[count - 1] >= PAUSE_CONTRAST * gaps[count]


def _split_text(text: str, regions: list[tuple[int, int]], total: int,
                cfg: PrepareConfig) -> tuple[list[Slice], list[str], str]:
    """Slices and one text per slice; method says how reliable the text is."""
    lo, hi = cfg.min_clip_s, cfg.max_clip_s
    slices = plan_slices(regions, total, TARGET_SR, lo, hi)
    if len(slices) == 1:
        return slices, [text], "whole"
    if not text:
        return slices, [""] * len(slices), "whole"
    sentences = split_sentences(text)
    n = len(sentences)
    # first choice: one sentence per slice, cut at the n-1 longest pauses; reliable when
    # those pauses stand out from the rest and every sentence's length fits its slice
    if 1 < n <= len(regions):
        by_sentence = slices_at(regions, longest_gaps(regions, n - 1), total, TARGET_SR)
        if (all(lo <= s.duration(TARGET_SR) <= hi for s in by_sentence)
                and _pauses_stand_out(regions, n - 1)):
            texts = group_sentences(sentences, [s.speech_s for s in by_sentence],
                                    SENTENCE_TOLERANCE)
            if texts is not None:
                return by_sentence, texts, "sentences"
    # else: whole sentences grouped onto the pause-based slices by length
    texts = group_sentences(sentences, [s.speech_s for s in slices], TEXT_TOLERANCE)
    if texts is not None:
        return slices, texts, "proportional"
    return slices, [""] * len(slices), "none"


def _machine_words(take: Take) -> list[dict[str, Any]] | None:
    """The timed words of a machine-made transcript, or None (a person's transcript)."""
    asr = asr_info(take)
    if not is_machine_made(take) or not asr or not asr.get("words"):
        return None
    return list(asr["words"])


def _texts_by_word_times(take: Take, slices: list[Slice]) -> list[str] | None:
    """A machine-made transcript comes with the time of every word: each slice gets
    exactly the words spoken inside it (a person's transcript keeps the other ways)."""
    words = _machine_words(take)
    if words is None:
        return None
    spans = [(s.start / TARGET_SR, s.end / TARGET_SR) for s in slices]
    return texts_from_words(words, spans)


def _slice_take(take: Take, total: int, regions: list[tuple[int, int]],
                words: list[dict[str, Any]] | None, heard: Heard | None,
                cfg: PrepareConfig) -> tuple[list[Slice], list[str], list[str], str]:
    """The take's slices, each one's text and speaker, and how the texts were found."""
    if heard is not None and heard.mixed:
        slices, whos = heard.slices(cfg.min_clip_s, cfg.max_clip_s)
        if words:
            kept = [(sl, w) for sl, w in zip(out_of_words(slices, words, TARGET_SR), whos,
                                              strict=True) if sl.end > sl.start]
            slices, whos = [k[0] for k in kept], [k[1] for k in kept]
        by_time = _texts_by_word_times(take, slices)
        if by_time is not None:
            return slices, by_time, whos, "timestamps"
        # the take's text is everyone's words: it cannot be told apart by speaker
        return slices, [""] * len(slices), whos, "none" if take.text.strip() else "whole"
    slices, texts, method = _split_text(take.text, regions, total, cfg)
    if len(slices) > 1:
        by_time = _texts_by_word_times(take, slices)
        if by_time is not None:
            texts, method = by_time, "timestamps"
    return slices, texts, [TARGET] * len(slices), method


def _process_take(voice: Voice, take: Take, key: str, cfg: PrepareConfig,
                  enrol: Enrolment | None = None) -> TakeOutcome:
    out = TakeOutcome(take.id, key)
    try:
        audio, stats = decode(take.audio_path, TARGET_SR,
                              max_seconds=cfg.max_file_minutes * 60.0)
    except BadAudioFile as exc:
        out.rejected = {"code": exc.reason_code, "reason": exc.message}
        return out
    out.audio_s = len(audio) / TARGET_SR
    if stats.non_finite:
        out.rejected = {"code": "non_finite",
                        "reason": f"contains {stats.non_finite} NaN or infinite samples"}
        return out
    audio = audio - np.float32(audio.mean())  # DC offset (reported below)
    levels = frame_levels(audio, TARGET_SR)
    regions = detect_speech(audio, TARGET_SR, cfg.vad, levels)
    words = _machine_words(take)
    if words:
        # the recogniser's word times overrule a pause the VAD heard inside a word
        regions = merge_by_words(regions, words, TARGET_SR)
    if speech_seconds(regions, TARGET_SR) < MIN_SPEECH_S:
        out.rejected = {"code": "silent",
                        "reason": "contains no speech (silence or steady noise only)"}
        return out
    take_snr = snr_db(audio, TARGET_SR, levels, regions)
    bg = background(audio, levels, regions)
    music = is_music_bed(bg)
    heard = None
    if enrol is not None and take.origin != "recorded":
        # a take recorded here is the voice by definition (and part of the enrolment)
        heard = hear_speakers(audio, TARGET_SR, regions, enrol.embedding(), enrol.encoder)
        out.speakers = heard.summary() if heard is not None else None
    slices, texts, whos, method = _slice_take(take, len(audio), regions, words, heard, cfg)
    den, judges = None, None
    min_snr = cfg.min_snr_db
    if cfg.denoise:
        den = denoise_take(audio, TARGET_SR, levels, regions)
        judges = judges_for(enrol)
    folder = voice.prepared
    target, ceiling = cfg.target_lufs, cfg.peak_dbfs
    for k, (sl, text, who) in enumerate(zip(slices, texts, whos, strict=True)):
        clip_id = take.id if len(slices) == 1 else f"{take.id}_{k + 1:02d}"
        seg = audio[sl.start:sl.end]
        snr = slice_snr(levels, sl.regions, bg.noise_power)
        cleaned = None
        if (den is not None and judges is not None and who == TARGET
                and snr < min_snr + NOISY_MARGIN_DB):
            cleaned = judge_slice(audio, den, levels, bg.noise_power, sl, TARGET_SR, text,
                                  judges)
            if cleaned["applied"]:
                seg = den.audio[sl.start:sl.end]
                snr = float(cleaned["snr_db"][1])
        # how it is spoken, before normalising takes its loudness away
        style = measure_clip(seg, TARGET_SR, text).to_dict()
        norm = normalize_loudness(seg, TARGET_SR, target, ceiling)
        start_s, end_s = sl.start / TARGET_SR, sl.end / TARGET_SR
        duration = len(seg) / TARGET_SR
        shortfall = (target - norm.loudness_after) if math.isfinite(norm.loudness_after) else 0.0
        facts = ClipFacts(
            duration_s=duration, text=text, text_method=method,
            clipped_samples=stats.clipped_between(start_s, end_s),
            source_samples=int(duration * stats.source_rate * stats.channels),
            snr_db=snr, dc_offset=stats.dc_offset, gain_shortfall_db=shortfall,
            rt60_s=bg.rt60_s, music_bed=music,
        )
        issues = check_clip(facts, cfg)
        speaker = heard.judge(sl, who) if heard is not None else None
        if speaker is not None:
            issues = speaker_issues(speaker, heard.source) + issues
        if cleaned is not None and cleaned["applied"]:
            issues.append(issue("denoised", "Denoised: " + describe_denoise(cleaned) + "."))
        rel = folder.clip_entry(clip_id)
        # staged: moved into clips/ only when the whole prepare is kept
        write_wav(folder.staged_clip(clip_id), norm.audio, TARGET_SR, "PCM_16")
        out.entries.append({
            "id": clip_id, "path": rel, "text": text, "duration_s": round(duration, 3),
            "sample_rate": TARGET_SR, "usable": is_usable(issues), "issues": issues,
            "source_take": take.id,
        })
        out.metrics.append({
            "id": clip_id, "source_take": take.id, "start_s": round(start_s, 3),
            "end_s": round(end_s, 3), "speech_s": round(sl.speech_s, 3),
            "loudness_in_lufs": _r(norm.loudness_before), "loudness_lufs": _r(norm.loudness_after),
            "gain_db": _r(norm.gain_db), "peak_limited": norm.peak_limited,
            "snr_db": _r(snr), "take_snr_db": _r(take_snr),
            "rt60_s": None if bg.rt60_s is None else round(bg.rt60_s, 2),
            "pause_flatness": None if bg.flatness is None else round(bg.flatness, 3),
            "music_bed": music, "clipped_samples": facts.clipped_samples,
            "text_method": method, "style": style,
            **({"speaker": speaker} if speaker is not None else {}),
            **({"denoise": cleaned} if cleaned is not None else {}),
        })
    return out


def check_recording(audio: np.ndarray, sample_rate: int, text: str = "",
                    cfg: PrepareConfig | None = None) -> dict[str, Any]:
    """Judge one recording in memory, as prepare would, without writing anything.

    For the record screen: right after a take, say whether to keep it. `audio`
    is (samples,) or (samples, channels), float in [-1, 1] or int16.
    """
    cfg = cfg or PrepareConfig()
    x = np.asarray(audio)
    if x.dtype == np.int16:
        x = x.astype(np.float32) / 32768.0
    x = x.astype(np.float32, copy=False)
    x2 = x.reshape(len(x), -1)
    finite = np.isfinite(x2)
    if not finite.all():
        x2 = np.where(finite, x2, 0.0).astype(np.float32)
    clipped = int(clipped_per_sample(np.abs(x2)).sum())
    mono = x2.mean(axis=1)
    dc = float(mono.mean()) if len(mono) else 0.0
    mono = resample(mono, sample_rate, TARGET_SR)
    mono = mono - np.float32(dc)
    out: dict[str, Any] = {"duration_s": round(len(x2) / sample_rate, 3),
                           "peak_dbfs": _r(20 * math.log10(max(float(np.abs(x2).max(
                               initial=0.0)), 1e-10))),
                           "clipped_samples": clipped, "non_finite": int((~finite).sum())}
    levels = frame_levels(mono, TARGET_SR)
    regions = speech_regions(mono, TARGET_SR, levels)
    speech = speech_seconds(regions, TARGET_SR)
    if out["non_finite"]:
        issues = [issue("non_finite", "The recording holds NaN or infinite samples.")]
    elif speech < MIN_SPEECH_S:
        issues = [issue("silent", "No speech was heard: check the microphone and its level.")]
    else:
        sl = plan_slices(regions, len(mono), TARGET_SR, 0.0, float("inf"))[0]
        seg = mono[sl.start:sl.end]
        snr = snr_db(mono, TARGET_SR, levels, regions)
        norm = normalize_loudness(seg, TARGET_SR, cfg.target_lufs, cfg.peak_dbfs)
        facts = ClipFacts(
            duration_s=len(seg) / TARGET_SR, text=text, text_method="whole",
            clipped_samples=clipped, source_samples=x2.size, snr_db=snr, dc_offset=dc,
            gain_shortfall_db=cfg.target_lufs - norm.loudness_after,
        )
        issues = check_clip(facts, cfg)
        out.update({"speech_s": round(speech, 3), "snr_db": _r(snr),
                    "loudness_lufs": _r(norm.loudness_before)})
    out["issues"] = issues
    out["usable"] = is_usable(issues) and not out["non_finite"] and speech >= MIN_SPEECH_S
    return out


def _r(x: float) -> float | None:
    return round(float(x), 2) if math.isfinite(x) else None


def _load_cached(path: Path, key: str, clip_file: Any) -> TakeOutcome | None:
    """A take's earlier result when its key matches and `clip_file(id)` holds each clip."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if data.get("key") != key:
        return None
    for e in data.get("entries", []):
        if not clip_file(str(e["id"])).is_file():
            return None
    return TakeOutcome(data["take_id"], key, data.get("entries", []), data.get("metrics", []),
                       data.get("rejected"), float(data.get("audio_s", 0.0)),
                       data.get("speakers"))


@contextmanager
def _prepare_lock(folder: PreparedFolder) -> Iterator[None]:
    """One prepare per voice at a time (the GUI and a script may both try)."""
    folder.path.mkdir(parents=True, exist_ok=True)
    lock = folder.lock
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and pid != os.getpid() and _alive(pid):
                raise WorkspaceError(f"Another prepare (process {pid}) is running on this "
                                     "voice.", "Wait for it to finish.") from None
            lock.unlink(missing_ok=True)  # left by a crashed run
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        break
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prepare(voice: Voice, on_event: EventCallback | Emitter | None = None,  # noqa: PLR0913
            cancel: Any = None, speakers: str = "auto",
            speaker_reference: str | os.PathLike[str] | None = None,
            denoise: bool | None = None, vad: str | None = None,
            speaker_encoder: str = "resemblyzer",
            base_model: str | os.PathLike[str] | None = None) -> dict[str, Any]:
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
    the voice's settings for this run.
    `speaker_encoder`: the embedding that decides who speaks: "resemblyzer" (the
    default) or "model", the speaker encoder of the Qwen3-TTS Base model `base_model`
    (a folder or a hub id already on this machine; default the standard Base model).
    """
    if vad is not None and vad not in VAD_METHODS:
        raise InputError(f"Unknown voice activity detector {vad!r}.",
                         f"Use one of: {', '.join(VAD_METHODS)}.")
    if speakers not in ("auto", "off"):
        raise InputError(f"Unknown speakers mode {speakers!r}.", "Use 'auto' or 'off'.")
    _refuse_without_takes(voice)  # before anything is written
    encoder = _speaker_encoder(speaker_encoder, base_model) if speakers == "auto" else None
    if speaker_reference is not None:
        set_speaker_reference(voice, Path(speaker_reference))
    with _prepare_lock(voice.prepared):
        return _prepare(voice, on_event, cancel, speakers, denoise, vad, encoder)


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
             speakers: str = "auto", denoise: bool | None = None,
             vad: str | None = None, encoder: Any = None) -> dict[str, Any]:
    em = as_emitter(on_event)
    t0 = time.perf_counter()
    takes = voice.list_takes()
    enrol = Enrolment(voice, takes, encoder) if speakers == "auto" else None
    cfg = voice.prepare_config
    if denoise is not None:
        cfg = dataclasses.replace(cfg, denoise=denoise)
    if vad is not None:
        cfg = dataclasses.replace(cfg, vad=vad)
    settings = _settings_record(cfg, enrol.key if enrol is not None else "off")
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
    _commit(prepared, work.staged)
    _remove_stale(prepared, {t.id for t in takes}, outcomes)
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
        outcome = _load_cached(prepared.cache_dir / f"{take.id}.json", key, prepared.clip_file)
        if outcome is not None:
            self.reused += 1
            return outcome
        staged = prepared.staged_cache(take.id)
        outcome = _load_cached(staged, key, prepared.staged_clip)  # a cancelled prepare's
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


def _commit(prepared: PreparedFolder, staged: dict[str, TakeOutcome]) -> None:
    """Move the staged clips and cache entries into place, replacing their takes' old ones."""
    prepared.clips_dir.mkdir(parents=True, exist_ok=True)
    prepared.cache_dir.mkdir(parents=True, exist_ok=True)
    for take_id, outcome in staged.items():
        for old in prepared.clips_dir.glob(f"{take_id}*.wav"):
            if old.stem == take_id or old.stem.startswith(f"{take_id}_"):
                old.unlink(missing_ok=True)
        for e in outcome.entries:
            os.replace(prepared.staged_clip(str(e["id"])), prepared.clip_file(str(e["id"])))
        os.replace(prepared.staged_cache(take_id), prepared.cache_dir / f"{take_id}.json")
    shutil.rmtree(prepared.staging_dir, ignore_errors=True)


def _remove_stale(prepared: PreparedFolder, take_ids: set[str],
                  outcomes: list[TakeOutcome]) -> None:
    """Delete clips and cache entries of takes that no longer exist."""
    keep = {e["id"] for o in outcomes for e in o.entries}
    for clip in prepared.clips_dir.glob("*.wav"):
        if clip.stem not in keep:
            clip.unlink(missing_ok=True)
    for cached in prepared.cache_dir.glob("*.json"):
        if cached.stem not in take_ids:
            cached.unlink(missing_ok=True)


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
        "speakers": _speaker_report(settings, outcomes, entries),
    }
    _say_what_replaces(voice, removed, entries, report)
    report["advice"] = _advice(report) + [r["message"] for r in removed]
    write_manifest(voice.path, entries)
    write_json(voice.prepared.report, report)
    write_text(voice.prepared.report_text, format_report(report))
    return report


def _say_what_replaces(voice: Voice, removed: list[dict[str, Any]],
                       entries: list[dict[str, Any]], report: dict[str, Any]) -> None:
    """Give each removed clip that something still named its sentence (`message`)."""
    usable = [e for e in entries if e["usable"]]
    listen = choose_reference(voice.path, usable, report=report) if usable else None
    for r in removed:
        now = (f" Listen now uses clip {listen}." if listen is not None
               and LISTEN_REFERENCE in r["used_by"] else "")
        r["message"] = (f"Clip {r['clip']} is no longer prepared, and {_and(r['used_by'])} "
                        f"named it.{now}")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _speaker_report(settings: dict[str, Any], outcomes: list[TakeOutcome],
                    entries: list[dict[str, Any]]) -> dict[str, Any]:
    key = str(settings.get("speakers", "off"))
    source = ("off" if key == "off" else "speaker reference" if key.startswith("reference:")
              else "recorded takes" if key.startswith("takes:") else "dominant speaker")
    checked = [o.speakers for o in outcomes if o.speakers]
    codes = Counter(i["code"] for e in entries for i in e["issues"])
    encoder = "off" if key == "off" else "model" if "|model:" in key else "resemblyzer"
    out = {"enrolment": source, "encoder": encoder, "takes_checked": len(checked),
           "takes_with_other_speakers": sum(1 for c in checked
                                            if c.get("other_s") or c.get("overlap_s")),
           "clips_another_speaker": codes.get("another_speaker", 0),
           "clips_overlap": codes.get("overlap", 0),
           "clips_decided_by_you": codes.get("speaker_kept", 0) + codes.get(
               "excluded_by_you", 0)}
    if source == "dominant speaker":
        out["note"] = ("No enrolment (no recorded takes, no --speaker-reference): in each "
                       "recording the speaker with the most speech was kept.")
    elif source == "off":
        out["note"] = "Speaker filtering is off: every voice was kept."
    else:
        out["note"] = f"The target speaker was enrolled from the voice's {source}."
    if encoder == "model":
        out["note"] += " Speakers were told apart by the base model's own speaker encoder."
    return out


def _advice(report: dict[str, Any]) -> list[str]:
    t = report["totals"]
    out: list[str] = []
    if not t["enough"]:
        missing = t["recommended_minutes"] - t["minutes_usable"]
        out.append(f"Record or import about {missing:.1f} more minutes of clean speech "
                   f"({t['recommended_minutes']:g} minutes recommended).")
    u = report["unusable_by_reason"]
    if u.get("needs_transcript") or u.get("empty_text"):
        out.append("Some clips have no transcript: add .txt files or a transcript list "
                   "and import again, or type the text.")
    if u.get("low_snr"):
        out.append("Some recordings are noisy: record in a quieter room, closer to the mic.")
    if u.get("too_reverberant") or report["issues_by_code"].get("reverberant"):
        out.append("Some recordings echo: record in a smaller or furnished room (curtains, "
                   "a sofa), closer to the microphone.")
    if report["issues_by_code"].get("music_bed"):
        out.append("Some recordings have music under the speech: the model would learn it; "
                   "use parts without music, or another recording.")
    if u.get("clipping"):
        out.append("Some recordings clip: lower the input gain.")
    if u.get("too_long"):
        out.append("Some speech runs over the maximum clip length without a pause.")
    sp = report.get("speakers") or {}
    if u.get("another_speaker") or u.get("overlap"):
        out.append("Other voices were left out (another speaker, or two voices at once): "
                   "check them on the Prepare page and keep any that are the target.")
        if sp.get("enrolment") == "dominant speaker":
            out.append("The speaker with the most speech was taken as the voice: record a "
                       "few takes or name a clip with --speaker-reference to choose.")
    return out


def format_report(report: dict[str, Any]) -> str:
    """The plain-text quality report a person reads."""
    t = report["totals"]
    lines = [
        f"Voice '{report['voice']}': prepared {report['created']}",
        f"  takes        {t['takes']} ({t['prepared_takes']} prepared, "
        f"{t['rejected_takes']} rejected)",
        f"  clips        {t['clips']} ({t['usable_clips']} usable)",
        f"  recorded     {t['minutes_recorded']:.2f} min",
        f"  usable       {t['minutes_usable']:.2f} min of {t['recommended_minutes']:g} "
        f"recommended ({t['percent_of_recommendation']:.0f}%)",
    ]
    if report["rejected"]:
        lines.append("Rejected files:")
        for r in report["rejected"]:
            lines.append(f"  {r['take']} {r['source']}: {r['reason']} [{r['code']}]")
    if report["unusable_by_reason"]:
        lines.append("Unusable clips by reason: " + ", ".join(
            f"{k} {v}" for k, v in sorted(report["unusable_by_reason"].items())))
    bad = [c for c in report["clips"] if c["issues"]]
    if bad:
        lines.append("Clip issues:")
        for c in bad[:200]:
            mark = " " if c["usable"] else "x"
            msgs = "; ".join(f"{i['code']}: {i['message']}" for i in c["issues"])
            lines.append(f" {mark} {c.get('id', '?')}: {msgs}")
        if len(bad) > 200:
            lines.append(f"  ... and {len(bad) - 200} more (see report.json)")
    sp = report.get("speakers") or {}
    if sp.get("takes_with_other_speakers"):
        lines.append(f"Speakers: {sp['note']} {sp['clips_another_speaker']} clips of another "
                     f"speaker and {sp['clips_overlap']} of overlapped voices left out.")
    for a in report.get("advice", []):
        lines.append(f"Advice: {a}")
    return "\n".join(lines) + "\n"
