"""JSON lines: one JSON object per line (manifests, metrics, resume records, transcripts).

Two ways to read, because the engine's files are read by two kinds of caller:
- strict (`strict=True`): the file is input the caller depends on (a prepare
  manifest, a user's transcript list); the first line that is not a JSON object
  raises `BadLine`, which says where, so the caller can say it in one sentence.
- tolerant (the default): the file may be growing in another process (a live
  run's metrics.jsonl, a manifest being rewritten) or the reader must never
  fail (the window); a torn or foreign line is skipped.
Blank lines are skipped either way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class BadLine(ValueError):
    """A line of a JSON-lines text that is not a JSON object (strict reading)."""

    def __init__(self, line_no: int, reason: str) -> None:
        super().__init__(f"line {line_no} {reason}")
        self.line_no = line_no
        #: "is not valid JSON" | "is not a JSON object"
        self.reason = reason


def parse_jsonl(text: str, *, strict: bool = False) -> list[dict[str, Any]]:
    """The objects of a JSON-lines text, in order."""
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            if strict:
                raise BadLine(n, "is not valid JSON") from exc
            continue
        if isinstance(obj, dict):
            rows.append(obj)
        elif strict:
            raise BadLine(n, "is not a JSON object")
    return rows


def read_jsonl(path: str | os.PathLike[str], *, strict: bool = False) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file, in order.

    Tolerant reading also treats a missing or unreadable file as empty; strict
    reading lets the OSError through (the caller says what is missing).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        if strict:
            raise
        return []
    return parse_jsonl(text, strict=strict)


def jsonl_line(row: Mapping[str, Any]) -> str:
    """One row as its line (newline included): UTF-8 text kept as it is."""
    return json.dumps(row, ensure_ascii=False) + "\n"


def append_jsonl(path: str | os.PathLike[str], row: Mapping[str, Any]) -> None:
    """Add one row at the end of a file (created when absent).

    One write of one whole line: a reader sees the line complete or not at all
    in practice, and a tolerant reader skips a torn one after a crash.
    """
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(jsonl_line(row))
