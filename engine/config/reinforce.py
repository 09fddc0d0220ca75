"""The reinforce stage's settings (issue 33): GRPO after fine-tuning, rewarded by the
clone's own scores. Stored per voice in voice.toml [reinforce]; CLI flags are made
from these fields (`engine.cli.settings`). Light: no torch.

The reward of one render is

    similarity_weight * similarity - wer_weight * min(WER, 1)
    - capped_weight * (hit the length cap) - rate_weight * rate_off
    + style_weight * style

where `similarity` is the independent encoder's cosine to the speaker's held-out clips,
`rate_off` is how far (log ratio) the speaking rate lies outside
[rate_low, rate_high] x the speaker's own rate (0 inside), and `style` (a run trained with
style descriptions, `style_weight` above 0) is, for a render of a prompt that carried a
trained style's instruction (`style_share` of the prompts), the share of the style's
measurable words ("slowly", "whisper", ...) whose measure moved the right way against the
speaker's plain baseline (0 for a plain prompt). That is the "voice" reward;
`reward` may name another, "package.module:factory" (`engine.reinforce.reward`), which
the weights above do not enter unless it reads them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from engine.config.schema import check, section, setting

#: the stage's own reward (speaker similarity, word errors, length cap, speaking rate)
VOICE_REWARD = "voice"
#: the form of a reward named by import: "package.module:factory"
_IMPORT_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
#: the settings that are text, not numbers
_TEXT_FIELDS = frozenset({"reward"})


@section("reinforce")
@dataclass(frozen=True)
class ReinforceConfig:
    """GRPO iterations from a run's checkpoint, with the frozen checkpoint as reference."""

    #: GRPO iterations (each: sample, score, update, checkpoint)
    iterations: int = setting(100, label="Iterations", at_least=1)
    #: held-out sentences per iteration
    prompts: int = setting(2, label="Sentences", unit="per iteration", at_least=1)
    #: renders per sentence: the advantage is each render's reward relative to its group
    group: int = setting(4, label="Renders", unit="per sentence", at_least=2)
    #: optimizer steps on each iteration's renders (the ratio moves off 1 after the first)
    updates: int = setting(2, label="Updates", unit="per iteration", at_least=1)
    #: learning rate of the stage's AdamW (far below fine-tuning's peak: it only nudges)
    lr: float = setting(1e-6, label="Learning rate", above=0)
    #: clip range of the policy ratio (PPO's epsilon)
    clip: float = setting(0.2, label="Ratio clip", above=0)
    #: weight of the KL penalty to the frozen starting checkpoint
    beta: float = setting(0.04, label="KL weight", at_least=0)
    #: frames a render may take before it is cut at the length cap (12 frames = 1 s)
    max_frames: int = setting(240, label="Length cap", unit="frames", at_least=2)
    #: write a checkpoint every N iterations (and always at the end and at a stop)
    checkpoint_every: int = setting(10, label="Checkpoint every", unit="iterations",
                                   at_least=1)
    #: the reward: "voice" (speaker similarity, word errors, length cap, speaking rate,
    #: weighed below) or "package.module:factory", a function of a RewardContext that
    #: returns the reward of a list of renders (engine/reinforce/reward.py)
    reward: str = setting(VOICE_REWARD, label="Reward")
    #: reward weight of speaker similarity (the independent encoder)
    similarity_weight: float = setting(1.0, label="Similarity weight", at_least=0)
    #: reward weight of the recogniser's word error rate (taken at most 1)
    wer_weight: float = setting(1.0, label="Word error weight", at_least=0)
    #: penalty for a render that hit the length cap (never ended by itself)
    capped_weight: float = setting(1.0, label="Length cap penalty", at_least=0)
    #: penalty per unit of log speaking-rate ratio outside the speaker's own range
    rate_weight: float = setting(1.0, label="Rate penalty", at_least=0)
    #: the slow end of the speaker's own range of speaking rate (ratio to their mean rate)
    rate_low: float = setting(0.8, label="Slowest rate", unit="×", above=0, below=1)
    #: the fast end of the speaker's own range of speaking rate (ratio to their mean rate)
    rate_high: float = setting(1.25, label="Fastest rate", unit="×", above=1)
    #: seed of the renders (iteration i draws seed * 1000003 + i: a resumed stage draws
    #: the same renders)
    seed: int = setting(0, label="Seed")
    #: reward weight of style obedience, for a run trained with style descriptions: a
    #: render of a prompt given a trained style's instruction earns this times the share of
    #: the style's measured words that moved the right way against the speaker's plain
    #: delivery (0: off, and no prompt carries an instruction)
    style_weight: float = setting(0.0, label="Style obedience weight", at_least=0)
    #: with a style weight: the share of the prompts that carry one of the run's trained
    #: styles (taken in turn); the rest stay plain
    style_share: float = setting(0.5, label="Styled prompts", at_least=0, at_most=1)

    def __post_init__(self) -> None:
        if not isinstance(self.reward, str) or not (
                self.reward == VOICE_REWARD or _IMPORT_SPEC.fullmatch(self.reward)):
            raise ValueError(f"reinforce.reward: must be \"{VOICE_REWARD}\" or an import spec "
                             f"\"package.module:factory\", got {self.reward!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _TEXT_FIELDS:
                continue
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value)):
                raise ValueError(f"reinforce.{f.name}: must be a finite number, got {value!r}")
        # the bounds are the fields' own (`check`); a count is a whole number
        for name in ("iterations", "prompts", "group", "updates", "max_frames",
                     "checkpoint_every", "seed"):
            if int(getattr(self, name)) != getattr(self, name):
                raise ValueError(f"reinforce.{name}: must be a whole number")
        check(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReinforceConfig:
        """The settings of a voice.toml [reinforce] table (or `to_dict`) over the defaults;
        a name that is no field is refused (a typo must not pass silently)."""
        return cls().replace(**d)

    def replace(self, **changes: Any) -> ReinforceConfig:
        """A copy with the given (not None) fields changed."""
        names = {f.name for f in dataclasses.fields(self)}
        if unknown := sorted(set(changes) - names):
            raise ValueError(f"reinforce: unknown field(s) {', '.join(unknown)}")
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
