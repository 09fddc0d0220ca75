"""Transcripts: reading them from sidecars and lists, and splitting them across slices.

Sources, for an audio file `x.wav`:
- a same-named `x.txt` beside it;
- an LJSpeech `metadata.csv` (`id|text|normalized text`, no header) in its
  folder or the folder above (LJSpeech keeps audio in `wavs/`);
- a list given explicitly: CSV/TSV with a header naming a path column
  (path/file/filename/audio/audio_filepath/id) and a text column
  (text/transcript/transcription/sentence/normalized_text), or JSON Lines
  with the same keys.

Keys are matched by path, then file name, then stem, so a list may name files
with or without folders and extensions.
"""

from __future__ import annotations

import csv
import io
import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from engine.core.errors import InputError
from engine.core.jsonl import BadLine, parse_jsonl
from engine.layout.voice import display_path
from engine.text import join_sentences, tidy_text

PATH_KEYS = ("path", "file", "filename", "file_name", "audio", "audio_filepath", "wav", "id")
TEXT_KEYS = ("normalized_text", "text", "transcript", "transcription", "sentence", "utterance")


class TranscriptIndex:
    """Text by audio file, looked up by path, name or stem."""

    def __init__(self) -> None:
        self._by_path: dict[str, str] = {}
        self._by_name: dict[str, str] = {}
        self._by_stem: dict[str, str] = {}
        self.source: str | None = None

    def __len__(self) -> int:
        return len(self._by_name) + len(self._by_stem)

    def add(self, key: str, text: str, base: Path | None = None) -> None:
        key = key.strip()
        if not key:
            return
        p = Path(key)
        if base is not None and not p.is_absolute():
            self._by_path[os.path.normpath(base / p)] = text
        elif p.is_absolute():
            self._by_path[os.path.normpath(p)] = text
        self._by_name[p.name] = text
        self._by_stem[p.stem if p.suffix else p.name] = text

    def lookup(self, audio: Path) -> str | None:
        for table, key in ((self._by_path, os.path.normpath(audio.absolute())),
                           (self._by_name, audio.name), (self._by_stem, audio.stem)):
            if key in table:
                return table[key]
        return None


def _pick(row: dict[str, str], keys: tuple[str, ...]) -> str | None:
    lowered = {(k or "").strip().lower(): v for k, v in row.items()}
    for k in keys:
        v = lowered.get(k)
        if v is not None and str(v).strip():
            return str(v)
    return None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"The transcript file {display_path(path)} is not UTF-8 text.",
                         "Save it as UTF-8 and try again.") from exc
    except OSError as exc:
        raise InputError(f"Cannot read the transcript file {display_path(path)}: "
                         f"{exc.strerror or exc}.") from exc


def parse_ljspeech(text: str, index: TranscriptIndex, base: Path) -> int:
    """`id|text|normalized` lines; the normalised column (numbers spelled out) wins."""
    count = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < 2:
            continue
        spoken = parts[2] if len(parts) > 2 and parts[2].strip() else parts[1]
        index.add(parts[0], tidy_text(spoken), base)
        count += 1
    return count


def load_transcripts(path: str | os.PathLike[str]) -> TranscriptIndex:
    """Read a CSV/TSV/JSONL list or an LJSpeech metadata.csv. Raises InputError."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"The transcript file {display_path(p)} does not exist.")
    raw = _read_text(p)
    base = p.parent
    index = TranscriptIndex()
    index.source = display_path(p)
    count = 0
    if not raw.strip():
        raise InputError(f"{display_path(p)} lists no transcripts.")
    if p.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        try:
            rows = parse_jsonl(raw, strict=True)
        except BadLine as exc:
            raise InputError(f"{display_path(p)} line {exc.line_no} {exc.reason}.") from exc
        for row in rows:
            key = _pick({k: str(v) for k, v in row.items()}, PATH_KEYS)
            text = _pick({k: str(v) for k, v in row.items() if v is not None}, TEXT_KEYS)
            if key is not None:
                index.add(key, tidy_text(text or ""), base)
                count += 1
    else:
        first = raw.splitlines()[0] if raw.strip() else ""
        header = [h.strip().lower() for h in re.split(r"[,|\t;]", first)]
        has_header = any(h in PATH_KEYS for h in header) and any(h in TEXT_KEYS for h in header)
        if not has_header and "|" in first:
            count = parse_ljspeech(raw, index, base)
        else:
            try:
                dialect = csv.Sniffer().sniff(first, delimiters=",|\t;")
            except csv.Error:
                dialect = csv.excel  # type: ignore[assignment]
            if not has_header:
                raise InputError(f"{display_path(p)} has no header naming a file and a "
                                 "text column.",
                                 "Add a first line such as 'file,text', or use the "
                                 "LJSpeech form 'id|text'.")
            for row in csv.DictReader(io.StringIO(raw), dialect=dialect):
                key = _pick(row, PATH_KEYS)
                if key is not None:
                    index.add(key, tidy_text(_pick(row, TEXT_KEYS) or ""), base)
                    count += 1
    if count == 0:
        raise InputError(f"{display_path(p)} lists no transcripts.")
    return index


def find_sidecar(audio: Path, cache: dict[Path, TranscriptIndex | None]) -> str | None:
    """Text from `audio.txt` or an LJSpeech metadata.csv in its folder or the one above."""
    txt = audio.with_suffix(".txt")
    if txt.is_file():
        try:
            return tidy_text(txt.read_text(encoding="utf-8-sig"))
        except (OSError, UnicodeDecodeError):
            return None
    for folder in (audio.parent, audio.parent.parent):
        meta = folder / "metadata.csv"
        if meta not in cache:
            try:
                cache[meta] = load_transcripts(meta) if meta.is_file() else None
            except InputError:
                cache[meta] = None
        idx = cache[meta]
        if idx is not None:
            found = idx.lookup(audio)
            if found is not None:
                return found
    return None


# --- splitting a transcript across slices ----------------------------------------------------
# (its sentences: engine.text.split_sentences, the rule speaking splits by too)

def _weight(sentence: str) -> int:
    # letters and digits carry the speaking time; punctuation does not
    return max(1, sum(c.isalnum() for c in sentence))


@dataclass(frozen=True)
class TextSplit:
    texts: list[str]
    method: str  # "whole" | "sentences" | "proportional" | "none"


def group_sentences(sentences: list[str], durations: list[float], tolerance: float = 0.3
                    ) -> list[str] | None:
    """Consecutive sentence groups, one per slice, whose length matches the slice's.

    Dynamic programming over cut positions minimising the squared mismatch of
    each slice's share of characters against its share of speech time. Returns
    None when no grouping keeps every slice within `tolerance` (relative).
    """
    k, n = len(durations), len(sentences)
    if k == 0 or n < k:
        return None
    w = [_weight(s) for s in sentences]
    prefix = [0]
    for x in w:
        prefix.append(prefix[-1] + x)
    total_w, total_d = prefix[-1], sum(durations)
    if total_d <= 0:
        return None
    share_d = [d / total_d for d in durations]
    inf = float("inf")
    # cost[j][i]: best cost placing sentences[:i] into slices[:j]
    cost = [[inf] * (n + 1) for _ in range(k + 1)]
    back = [[0] * (n + 1) for _ in range(k + 1)]
    cost[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n - (k - j) + 1):
            for m in range(j - 1, i):
                if cost[j - 1][m] == inf:
                    continue
                share = (prefix[i] - prefix[m]) / total_w
                c = cost[j - 1][m] + ((share - share_d[j - 1]) / share_d[j - 1]) ** 2
                if c < cost[j][i]:
                    cost[j][i], back[j][i] = c, m
    if cost[k][n] == inf:
        return None
    cuts = [n]
    for j in range(k, 0, -1):
        cuts.append(back[j][cuts[-1]])
    cuts.reverse()
    groups = [sentences[a:b] for a, b in itertools.pairwise(cuts)]
    for g, sd in zip(groups, share_d, strict=True):
        share = sum(_weight(s) for s in g) / total_w
        if abs(share - sd) / sd > tolerance:
            return None
    return [join_sentences(g) for g in groups]


# --- machine transcripts: one text per slice from the recogniser's word times --------------

def texts_from_words(words: list[list[object]] | list[tuple[str, float, float]],
                     spans_s: list[tuple[float, float]]) -> list[str] | None:
    """Text for each slice (start_s, end_s) of a take from recognised words and their times.

    A word belongs to the slice holding its midpoint (or, between slices, to the
    nearest one). `words` are `[text, start_s, end_s]` as a take's `extra.asr.words`
    stores them. None when there are no timed words (then prepare splits by length).
    """
    timed = []
    for w in words:
        try:
            text, start, end = str(w[0]), float(w[1]), float(w[2])  # type: ignore[arg-type]
        except (IndexError, TypeError, ValueError):
            return None
        if text.strip():
            timed.append((text.strip(), (start + end) / 2.0))
    if not timed or not spans_s:
        return None
    out: list[list[str]] = [[] for _ in spans_s]
    for text, mid in timed:
        best = min(range(len(spans_s)), key=lambda k: 0.0 if spans_s[k][0] <= mid < spans_s[k][1]
                   else min(abs(mid - spans_s[k][0]), abs(mid - spans_s[k][1])))
        out[best].append(text)
    return [" ".join(ws) for ws in out]
