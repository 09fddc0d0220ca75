"""The evaluation's settings that change what it measures or which checkpoint it calls
best (`engine.quality.evaluate`). CLI flags of `evaluate` are made from these fields
(`engine.cli.settings`). Light: no torch.

For a run trained with style descriptions, each checkpoint also renders the first
`style_sentences` held-out sentences plainly and with each trained style, and checks
each style's measurable words against the plain render. The best-checkpoint rule then
ranks the checkpoints that still say the words and end their sentences by

    similarity + style_weight * (share of style checks that went the right way)

so the default 0 is the rule for runs without styles: similarity alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from engine.config.schema import check, section, setting


@section("evaluate")
@dataclass(frozen=True)
class EvaluateConfig:
    """What the evaluation measures beyond the plain renders, and how the best is chosen."""

    #: weight of style obedience in the best-checkpoint rule: a checkpoint scores its
    #: similarity plus this times the share of its style checks that moved the right way
    #: (0: similarity alone, as for a run without styles)
    style_weight: float = setting(0.0, label="Style weight", at_least=0, at_most=1)
    #: held-out sentences rendered with each trained style per checkpoint (0: styles are
    #: not measured); each costs one render per style and one plain
    style_sentences: int = setting(2, label="Sentences per style", at_least=0, at_most=8)
    #: beside training (a watch): suggest stopping when the best checkpoint has not
    #: improved for this many evaluated checkpoints (0: never); the window then stops
    #: training, saving a checkpoint
    patience: int = setting(0, label="Early stop after", unit="evaluations", at_least=0,
                            at_most=100)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"evaluate.{f.name}: must be a number, got {value!r}")
        for name in ("style_sentences", "patience"):
            if int(getattr(self, name)) != getattr(self, name):
                raise ValueError(f"evaluate.{name}: must be a whole number")
        check(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvaluateConfig:
        """The settings of `to_dict` over the defaults; an unknown name is refused."""
        names = {f.name for f in dataclasses.fields(cls)}
        if unknown := sorted(set(d) - names):
            raise ValueError(f"evaluate: unknown field(s) {', '.join(unknown)}")
        return cls(**d)
