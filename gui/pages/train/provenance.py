"""Where the Train form's values came from, in the form's words.

The engine merges a run's settings from layers (the request, a config file, the run being
resumed, voice.toml, the presets, the schema's defaults) and says where each value came
from (`engine.config.layers`): a dry run's result and a run's saved config.json carry it
under "provenance". The form sends only what a person chose, so a value it shows may be
another layer's: the field's tooltip says whose, and a note sums up the sources.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from engine.config.layers import DEFAULT, REQUEST
from engine.config.schema import label_of, lookup


def not_asked(provenance: Mapping[str, str], paths: Iterable[str]) -> dict[str, str]:
    """{path: source} of the `paths` whose value a layer other than the request gave (the
    schema's default included): the values the form shows but the person did not set."""
    found = {path: provenance.get(path) for path in paths}
    return {path: source for path, source in found.items()
            if isinstance(source, str) and source != REQUEST}


def sources_words(sources: Mapping[str, str]) -> str:
    """"Learning rate and epochs from the preset for 0.6B; speaker name from voice.toml."
    (the schema's defaults left out: most values are theirs), or "" when none."""
    by_source: dict[str, list[str]] = {}
    for path, source in sources.items():
        if source != DEFAULT:
            label = label_of(*lookup(path))
            by_source.setdefault(source, []).append(label[:1].lower() + label[1:])
    parts = [f"{_listed(labels)} from {source}" for source, labels in by_source.items()]
    return (parts[0][:1].upper() + "; ".join(parts)[1:] + ".") if parts else ""


def field_source(help_text: str, source: str | None) -> str:
    """A field's tooltip: its help, then where its value came from when not the form."""
    if not source:
        return help_text
    return f"{help_text}\n\nThis value: from {source}." if help_text else \
        f"This value: from {source}."


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
