"""Which prompts a voice still lacks, and the sentences it never said.

A recorded take stores the prompt id in its metadata (`Take.prompt_id`), which
is all the engine needs to hand out the next unrecorded prompt. The sets themselves
are `engine.layout.prompts`.

Light module: no numpy, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from engine.core.errors import VoxshardError
from engine.layout.manifest import read_manifest
from engine.layout.prompts import (
    Prompt,
    PromptSet,
    StyleCount,
    get_prompt_set,
    in_groups,
    list_prompt_sets,
    style_counts,
)
from engine.layout.voice import Voice
from engine.text import comparison_key


def recorded_prompt_ids(voice: Voice) -> set[str]:
    """Prompts with a take that can train (an unusable take's prompt is read again)."""
    return {str(t.prompt_id) for t in voice.list_takes() if t.fills_prompt}

def voice_prompts(voice: Voice, set_name: str | None = None) -> tuple[PromptSet, list[Prompt]]:
    """The set a voice reads (or `set_name`) and its prompts to read, in set order: only
    the groups chosen for the voice ([voice] prompt_groups) when it is the voice's set."""
    ps = get_prompt_set(set_name or voice.prompt_set)
    return ps, in_groups(ps, voice.prompt_groups if ps.name == voice.prompt_set else [])


def next_prompts(voice: Voice, count: int = 1, set_name: str | None = None) -> list[Prompt]:
    """The first `count` prompts of the voice's set that have no take yet, in set order."""
    _ps, prompts = voice_prompts(voice, set_name)
    done = recorded_prompt_ids(voice)
    return [p for p in prompts if p.id not in done][: max(0, count)]


def next_prompt(voice: Voice, set_name: str | None = None) -> Prompt | None:
    found = next_prompts(voice, 1, set_name)
    return found[0] if found else None


def prompt_progress(voice: Voice, set_name: str | None = None) -> dict[str, Any]:
    ps, prompts = voice_prompts(voice, set_name)
    done = recorded_prompt_ids(voice)
    recorded = sum(1 for p in prompts if p.id in done)
    return {"set": ps.name, "total": len(prompts), "recorded": recorded,
            "remaining": len(prompts) - recorded,
            "styles": [s.to_dict() for s in style_counts(prompts, done)]}

def style_progress(voice: Voice, set_name: str | None = None) -> list[StyleCount]:
    """The takes a voice has per style against what its prompts offer (its chosen groups)."""
    _ps, prompts = voice_prompts(voice, set_name)
    return style_counts(prompts, recorded_prompt_ids(voice))


def unsaid_sentences(voice: Voice, exclude: Iterable[str] = (), folder: Path | None = None
                     ) -> list[str]:
    """Sentences of the bundled sets in the voice's language that the voice never said:
    no take and no prepared clip reads them (so never a training text), nor does any of
    `exclude` (e.g. the evaluation's sentences); in set order, each once."""
    said = {comparison_key(t.text) for t in voice.list_takes() if t.text}
    try:
        said |= {comparison_key(c.get("text")) for c in read_manifest(voice.path,
                                                                      usable_only=False)}
    except VoxshardError:
        pass  # not prepared: its takes are all it has said
    said |= {comparison_key(t) for t in exclude}
    lang = voice.language.strip().lower()
    out: dict[str, str] = {}
    for ps in list_prompt_sets(folder):
        if ps.language.strip().lower() != lang:
            continue
        for p in ps.prompts:
            key = comparison_key(p.text)
            if key and key not in said:
                out.setdefault(key, p.text)
    return list(out.values())
