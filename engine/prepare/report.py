"""The words of a prepare's quality report: its advice, who was heard, what replaces a
clip something still named, and the plain-text report a person reads.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from engine.layout.manifest import LISTEN_REFERENCE, choose_reference
from engine.layout.voice import Voice
from engine.prepare.staging import TakeOutcome


def say_what_replaces(voice: Voice, removed: list[dict[str, Any]],
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


def speaker_report(settings: dict[str, Any], outcomes: list[TakeOutcome],
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


def advice(report: dict[str, Any]) -> list[str]:
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
