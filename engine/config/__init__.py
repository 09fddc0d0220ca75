"""The one configuration tree: every tunable of Voxshard as documented dataclasses.

    VoxshardConfig
    ├── prepare: PrepareConfig   (stored per voice in voice.toml [prepare])
    ├── train:   TrainConfig     (engine.config.train; saved resolved with every run)
    ├── speak:   SpeakOptions    (engine.config.speak; defaults for rendering)
    ├── reinforce: ReinforceConfig (engine.config.reinforce; voice.toml [reinforce])
    └── evaluate: EvaluateConfig (engine.config.evaluate; `evaluate` flags)

Each class validates itself in `__post_init__` and raises `ValueError` with
the field name. Importing this module is cheap (no torch).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from engine.config.evaluate import EvaluateConfig
from engine.config.reinforce import ReinforceConfig
from engine.config.schema import check, section, setting
from engine.config.speak import SpeakOptions
from engine.config.train import TrainConfig

#: voice activity detectors `prepare` can use (engine/audio/vad.py)
VAD_CHOICES: tuple[str, ...] = ("silero", "energy")


@section("prepare")
@dataclass(frozen=True)
class PrepareConfig:
    """How `prepare` turns takes into training clips."""

    #: integrated loudness of every clip (ITU-R BS.1770), LUFS
    target_lufs: float = setting(-23.0, label="Loudness", unit="LUFS", at_least=-40,
                                 at_most=-10)
    #: sample peak ceiling after gain, dBFS; quieter clips keep their gain lower
    peak_dbfs: float = setting(-1.0, label="Peak ceiling", unit="dBFS", at_least=-12,
                               at_most=0)
    #: clips shorter than this are unusable (seconds)
    min_clip_s: float = setting(1.0, label="Shortest clip", unit="s", at_least=0.2)
    #: long recordings are sliced at pauses into clips no longer than this (seconds;
    #: longer clips train badly)
    max_clip_s: float = setting(15.0, label="Longest clip", unit="s", at_most=30)
    #: clips with a lower signal-to-noise estimate are unusable (dB)
    min_snr_db: float = setting(15.0, label="Lowest SNR", unit="dB", at_least=0)
    #: files longer than this are refused from their header, never decoded (minutes)
    max_file_minutes: float = setting(60.0, label="Longest file", unit="min", above=0)
    #: usable minutes the quality report measures a voice against
    recommended_minutes: float = setting(10.0, label="Recommended audio", unit="min", above=0)
    #: voice activity detector: "silero" (a neural model in its wheel) or the "energy" fallback
    vad: str = setting("silero", label="Speech detector", choices=VAD_CHOICES)
    #: denoise noisy slices, each kept only where SNR, speaker similarity and the
    #: recognised words do not get worse
    denoise: bool = setting(False, label="Denoise")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("vad", "denoise"):
                continue
            if (not isinstance(value, int | float) or isinstance(value, bool)
                    or not math.isfinite(value)):
                raise ValueError(f"prepare.{f.name}: must be a finite number, got {value!r}")
        if not isinstance(self.denoise, bool):
            raise ValueError(f"prepare.denoise: must be true or false, got {self.denoise!r}")
        check(self)
        if self.min_clip_s >= self.max_clip_s:
            raise ValueError("prepare.min_clip_s: must be below max_clip_s")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PrepareConfig:
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"prepare: unknown field(s) {', '.join(sorted(unknown))}")
        return cls(**d)


@dataclass
class VoxshardConfig:
    """Everything, in one tree (what a script or the GUI may tune)."""

    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    speak: SpeakOptions = field(default_factory=SpeakOptions)
    reinforce: ReinforceConfig = field(default_factory=ReinforceConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)

    def to_dict(self) -> dict[str, Any]:
        return {"prepare": self.prepare.to_dict(), "train": self.train.to_dict(),
                "speak": dataclasses.asdict(self.speak), "reinforce": self.reinforce.to_dict(),
                "evaluate": self.evaluate.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VoxshardConfig:
        unknown = set(d) - {"prepare", "train", "speak", "reinforce", "evaluate"}
        if unknown:
            raise ValueError(f"unknown section(s) {', '.join(sorted(unknown))}")
        return cls(prepare=PrepareConfig.from_dict(d.get("prepare", {})),
                   train=TrainConfig.from_dict(d.get("train", {})),
                   speak=SpeakOptions(**d.get("speak", {})),
                   reinforce=ReinforceConfig.from_dict(d.get("reinforce", {})),
                   evaluate=EvaluateConfig.from_dict(d.get("evaluate", {})))
