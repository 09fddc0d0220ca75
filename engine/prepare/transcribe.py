"""Transcribe a voice's takes: fill missing transcripts, flag doubtful ones.

For every take (or the ones named):
- no transcript: the recogniser's text becomes the transcript, marked as
  machine-made in the take's metadata (`extra.transcript_source = "asr"`);
- a transcript: it is checked against what the recogniser hears; a word
  error rate above the threshold flags the take as doubtful (a likely
  mislabelled clip). The transcript itself is left alone.

What was heard is kept in `extra.asr` of the take's JSON (only the JSON
changes, the audio stays untouched):

    {"backend", "model", "text", "words": [[word, start_s, end_s], ...],
     "language", "wer" (against the human transcript, or null),
     "doubtful": bool, "reason": str | null, "checked": ISO time}

The word times let prepare give each slice of a long recording its own
text (`engine.prepare.transcripts.texts_from_words`).
"""

from __future__ import annotations

import threading
from typing import Any

from engine.asr.recognizer import Recognizer, Transcript, load_audio, load_recognizer
from engine.asr.wer import word_count, word_errors
from engine.core.atomic import write_json
from engine.core.errors import AudioError, Cancelled, InputError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.layout.voice import Take, Voice, display_path, now_iso
from engine.text import tidy_text

#: a human transcript whose recognised words differ more than this is doubtful.
#: pocketsphinx gets about 0.2 (worst about 0.55) on clean speech it can read,
#: and near 1 on a different sentence; Whisper is much closer on correct text.
DEFAULT_THRESHOLD = {"pocketsphinx": 0.75}
WHISPER_THRESHOLD = 0.5
#: plausible speaking rate of a machine transcript, words per second of audio
RATE_RANGE = (0.4, 6.0)
#: below this mean word probability (Whisper only) a machine transcript needs a look
MIN_CONFIDENCE = 0.5


def default_threshold(backend: str) -> float:
    return DEFAULT_THRESHOLD.get(backend, WHISPER_THRESHOLD)


def is_machine_made(take: Take) -> bool:
    """True while the take's transcript is still the recogniser's text (a person who
    edits it makes it theirs, whatever the marker says)."""
    asr = take.extra.get("asr") if isinstance(take.extra, dict) else None
    return (take.extra.get("transcript_source") == "asr" and isinstance(asr, dict)
            and tidy_text(str(asr.get("text") or "")) == take.text and bool(take.text))


def asr_info(take: Take) -> dict[str, Any] | None:
    """What the recogniser heard in this take (see the module doc), if it ran."""
    asr = take.extra.get("asr") if isinstance(take.extra, dict) else None
    return asr if isinstance(asr, dict) else None


def _judge_machine(heard: Transcript) -> str | None:
    """Why a machine transcript needs a look, or None."""
    if not heard.text:
        return "the recogniser heard no words"
    if heard.duration_s > 0:
        rate = word_count(heard.text) / heard.duration_s
        if heard.duration_s >= 2.0 and not RATE_RANGE[0] <= rate <= RATE_RANGE[1]:
            return f"{rate:.1f} words per second is implausible"
    if heard.confidence is not None and heard.confidence < MIN_CONFIDENCE:
        return f"the recogniser was unsure (confidence {heard.confidence:.2f})"
    return None


def check_take(take: Take, heard: Transcript, threshold: float) -> dict[str, Any]:
    """The `extra.asr` record for a take and what was heard in it."""
    record: dict[str, Any] = {
        "backend": heard.backend, "text": heard.text,
        "words": [w.to_list() for w in heard.words], "language": heard.language,
        "wer": None, "doubtful": False, "reason": None, "checked": now_iso(),
    }
    if take.text and not is_machine_made(take):
        errors = word_errors(take.text, heard.text)
        record["wer"] = round(errors.wer, 4)
        if errors.wer > threshold:
            record["doubtful"] = True
            record["reason"] = (f"the recognised words differ from the transcript "
                                f"(word error rate {errors.wer:.2f}); the clip may be "
                                "mislabelled")
    else:
        reason = _judge_machine(heard)
        record["doubtful"] = reason is not None
        record["reason"] = reason
    return record


def _save(take: Take, record: dict[str, Any], fill: bool, model: str) -> Take:
    data = take.to_dict()
    extra = dict(data.get("extra") or {})
    extra["asr"] = {**record, "model": model}
    if fill:
        data["text"] = tidy_text(record["text"])
        extra["transcript_source"] = "asr"
    data["extra"] = extra
    write_json(take.meta_path, data)  # only the JSON changes; the audio stays untouched
    return Take.from_meta(take.meta_path)


def transcribe_takes(voice: Voice, asr: str | Recognizer | None = None, *,
                     takes: list[str] | None = None, recheck: bool = False,
                     threshold: float | None = None, device: str | None = None,
                     on_event: EventCallback | Emitter | None = None,
                     cancel: threading.Event | Any = None) -> dict[str, Any]:
    """Fill missing transcripts and flag doubtful ones (see the module doc).

    `asr`: a recogniser or its spec (`engine.asr.recognizer.load_recognizer`).
    `takes`: ids to look at (default: all). Takes already checked by the same
    model are skipped unless `recheck`. A take whose audio cannot be read is
    skipped with its reason; the others go on.
    """
    em = as_emitter(on_event)
    all_takes = voice.list_takes()
    if takes is not None:
        chosen = [voice.find_take(t) for t in takes]
    else:
        chosen = [t for t in all_takes if not t.extra.get("excluded")]
    if not chosen:
        raise InputError(f"The voice at {voice.path} has no takes to transcribe.",
                         "Record some, or add files with `voxshard-engine import`.")
    em.state("loading_recognizer", detail=str(asr or "auto"))
    rec = asr if hasattr(asr, "transcribe") else load_recognizer(asr, device)  # type: ignore[arg-type]
    model = str(getattr(rec, "model", ""))
    limit = threshold if threshold is not None else default_threshold(rec.backend)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    audio_s = compute_s = 0.0
    em.log(f"Recognising speech with {rec.backend} ({model}).")
    for i, take in enumerate(chosen):
        if cancel is not None and (cancel() if callable(cancel) else cancel.is_set()):
            raise Cancelled("Transcription was cancelled; takes done so far are saved.")
        em.progress("transcribe", i, len(chosen), take=take.id)
        previous = asr_info(take)
        if (not recheck and previous is not None and previous.get("model") == model
                and (take.text or previous.get("text") == "")):
            rows.append(_row(take, previous, filled=False, reused=True))
            continue
        try:
            audio = load_audio(take.audio_path)
        except AudioError as exc:
            skipped.append({"take": take.id, "reason": exc.message})
            em.log(f"Take {take.id}: {exc.message}; skipped.", level="warning", take=take.id)
            continue
        heard = rec.transcribe(audio, voice.language)
        audio_s += heard.duration_s
        compute_s += heard.compute_s
        fill = not take.text
        record = check_take(take, heard, limit)
        saved = _save(take, record, fill, model)
        row = _row(saved, record, filled=fill, reused=False)
        rows.append(row)
        if record["doubtful"]:
            em.log(f"Take {take.id}: {record['reason']}.", level="warning", take=take.id,
                   code="doubtful_transcript")
        em.emit("progress", stage="transcribe", done=i + 1, total=len(chosen), take=take.id,
                text=row["text"], machine=row["machine"], wer=row["wer"],
                doubtful=row["doubtful"])
    em.progress("transcribe", len(chosen), len(chosen))
    filled = [r for r in rows if r["filled"]]
    doubtful = [r for r in rows if r["doubtful"]]
    checked = [r for r in rows if r["wer"] is not None]
    lines = [f"Transcribed {len(filled)} take(s) without a transcript and checked "
             f"{len(checked)} with one ({rec.backend}, {model})."]
    if filled:
        lines.append("Machine-made transcripts are marked as such; review the doubtful "
                     "ones before training.")
    for r in doubtful:
        lines.append(f"  doubtful {r['take']}: {r['reason']}")
    for s in skipped:
        lines.append(f"  skipped  {s['take']}: {s['reason']}")
    return {"backend": rec.backend, "model": model, "threshold": limit, "takes": rows,
            "filled": len(filled), "checked": len(checked), "doubtful": len(doubtful),
            "skipped": skipped, "audio_s": round(audio_s, 3),
            "rtf": round(audio_s / compute_s, 3) if compute_s > 0 else None,
            "summary": "\n".join(lines)}


def _row(take: Take, record: dict[str, Any], filled: bool, reused: bool) -> dict[str, Any]:
    return {"take": take.id, "text": take.text, "recognised": record.get("text", ""),
            "machine": is_machine_made(take), "filled": filled, "reused": reused,
            "wer": record.get("wer"), "doubtful": bool(record.get("doubtful")),
            "reason": record.get("reason"), "source": display_path(take.source or "")}
