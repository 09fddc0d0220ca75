"""Counts in words: "1 sentence", "3 models" (the window said "1 sentences × 3 models")."""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`n` and `noun`, plural unless `n` is 1 (`plural` for nouns without a plain -s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
