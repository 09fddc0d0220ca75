"""The kinds of voice, one word each: what a synthesizer speaks with, what a voice keeps
on disk, and what a served name stands for.

Three vocabularies, because they answer three different questions and are written to
disk and to clients under different words:

- `VoiceKind`: what a resolved voice loads (`engine.synth.voice.VoiceSource.kind`, the
  entries of an evaluation). A training checkpoint is one, though no voice keeps it as
  a tier; a zero-shot preview clones from any clip, not only the voice's instant one.
- `Tier`: what a voice keeps to speak with (`engine.layout.tiers`): instant, adapter,
  full. Written in adapter records and listed by the catalog, the window and servers.
- `ServedKind`: what a name a server offers stands for (`engine.serve.voices`): a voice
  (its best tier, else its latest run), one of its tiers, a run's checkpoint, or the
  base a server clones a client's clip on.

Each is a `StrEnum`: JSON, HTTP and the CLI read and write the same strings as before,
and a value read back compares equal to its member. Values read from disk go through
`parse_kind`, which refuses an unknown word in one sentence. Light: no torch, no Qt.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from engine.core.errors import WorkspaceError


class VoiceKind(StrEnum):
    """What a resolved voice loads and speaks with."""

    #: an exported model folder in the official format (a speaker row of its own)
    CUSTOM_VOICE = "custom_voice"
    #: a training run's checkpoint on its base model
    CHECKPOINT = "checkpoint"
    #: LoRA adapters and a speaker row on their base model
    ADAPTER = "adapter"
    #: a base model cloning from a reference clip (an instant voice, or a preview)
    ZERO_SHOT = "zero_shot"


class Tier(StrEnum):
    """What a voice keeps on disk to speak with."""

    INSTANT = "instant"
    ADAPTER = "adapter"
    FULL = "full"

    @property
    def voice_kind(self) -> VoiceKind:
        """What a voice of this tier loads as."""
        return _KIND_OF_TIER[self]


class ServedKind(StrEnum):
    """What a name a server offers stands for."""

    #: a voice folder: its best tier (full, adapter, latest run, instant, in that order)
    VOICE = "voice"
    #: a run folder: its latest checkpoint
    RUN = "run"
    EXPORT = "export"
    ADAPTER = "adapter"
    INSTANT = "instant"
    #: the server's reference base, cloning from a client's clip (never listed)
    REFERENCE = "reference"

    @classmethod
    def of_tier(cls, tier: Tier) -> ServedKind:
        """The served kind of one tier of a voice, named on its own."""
        return _SERVED_OF_TIER[tier]


_KIND_OF_TIER = {Tier.INSTANT: VoiceKind.ZERO_SHOT, Tier.ADAPTER: VoiceKind.ADAPTER,
                 Tier.FULL: VoiceKind.CUSTOM_VOICE}
_SERVED_OF_TIER = {Tier.INSTANT: ServedKind.INSTANT, Tier.ADAPTER: ServedKind.ADAPTER,
                   Tier.FULL: ServedKind.EXPORT}

#: the tiers in the order a voice prefers them: what it speaks with first leads
TIER_PREFERENCE = (Tier.FULL, Tier.ADAPTER, Tier.INSTANT)

Kind = TypeVar("Kind", VoiceKind, Tier, ServedKind)


def parse_kind(kind: type[Kind], value: object, where: str) -> Kind:
    """`value` (read from `where`: a file, a record) as a member of `kind`, or a
    one-sentence refusal that names the words it knows."""
    try:
        return kind(value)
    except ValueError:
        known = ", ".join(m.value for m in kind)
        raise WorkspaceError(f"{where} names an unknown {kind.__name__} {value!r}.",
                             f"Known: {known}. It was written by another version of "
                             "Voxshard, or edited by hand.") from None
