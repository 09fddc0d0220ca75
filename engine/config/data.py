"""How prepared clips become batches: the `data` section of the training config.

It lives here, below `train`, so that the data layer never imports `train`;
`engine.config.train.TrainConfig` holds it as its `data` section. Light: no
torch import.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.schema import check, section, setting


def _check(cond: bool, name: str, why: str) -> None:
    if not cond:
        raise ValueError(f"{name}: {why}")


@section("data")
@dataclass
class DataConfig:
    """How prepared clips become batches."""

    #: clips per optimizer micro-step over all workers, at least one each (each gets
    #: about batch size / workers, balanced by length; not given: the preset's for the
    #: voice's amount of audio)
    batch_size: int = setting(8, label="Batch size", at_least=1)
    #: optimizer steps accumulate this many micro-steps
    grad_accum: int = setting(1, label="Gradient accumulation", at_least=1)
    #: clips are sorted by length inside windows of this many batches before
    #: being cut into batches, so a batch holds similar lengths (less padding)
    bucket_batches: int = 16
    #: fraction of usable clips held out for validation (0 disables validation);
    #: never more than a fifth of the clips
    val_fraction: float = 0.05
    #: at least this many clips are held out when val_fraction > 0
    val_min: int = 2
    #: clips whose sequence (text + frames + 11 specials) exceeds this are skipped
    max_seq_len: int = 2048
    #: id of the clip whose speaker-encoder x-vector fills the speaker slot;
    #: None picks automatically among the best-quality clips
    reference_clip: str | None = None
    #: seed of the split and of the per-epoch order
    seed: int = 0
    #: share of the clips with a style description that train without it, so
    #: speech without an instruction stays the voice's plain default (chosen
    #: per clip by the seed: the same on every worker and after a resume)
    plain_share: float = setting(0.2, label="Styled clips trained plain", at_least=0,
                                 at_most=1)

    def __post_init__(self) -> None:
        check(self)
        _check(self.bucket_batches >= 1, "data.bucket_batches", "must be >= 1")
        _check(0.0 <= self.val_fraction < 1.0, "data.val_fraction", "must be in [0, 1)")
        _check(self.val_min >= 0, "data.val_min", "must be >= 0")
        _check(self.max_seq_len >= 32, "data.max_seq_len", "must be >= 32")
