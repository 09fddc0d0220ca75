"""`TrainRequest`: what one start of training was asked for, from the CLI, the API or the app.

Its settings are the config's own (`engine.config.train.REQUEST_SETTINGS`), named by
field and checked against the schema's rules (`engine.config.schema`), so a setting's
name, bounds and words live in its config field and nowhere here. Light: no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config.schema import by_name, rule_of, value_problem
from engine.config.train import REQUEST_SETTINGS
from engine.core.errors import InputError
from engine.train.presets import VOLUME_KEYS

#: {field name: "section.field"} of every setting a request may give
SETTINGS: dict[str, str] = by_name(REQUEST_SETTINGS)


@dataclass(frozen=True)
class TrainRequest:
    """What the user asked for: the same object from the CLI, the Python API and the app.

    `settings` holds the config settings given, by field name (workers, steps, lr,
    trainable, predictor_frames, ...: `SETTINGS`); one left out or None is "not given":
    presets by data volume and model size decide (`engine.train.presets.preset`), or, on
    resume, the run's saved setting; the code predictor's frames and LoRA adapters on it
    default to the voice's [train] settings. `validated()` checks every given value and
    says what to do in one sentence.

    storage: where the run's checkpoints go (`engine.core.storage`): None = the voice's
    setting (default: its own runs/), a shared folder, or a URI such as
    s3://bucket/prefix; "default" = the voice's runs/. A given storage is remembered in
    voice.toml for the voice's next runs. preflight: check every node of the cluster first
    (`engine.train.preflight`); default: on an existing cluster (`address`) only.
    use_gpu: None uses GPUs when there are some. preset: the band of audio whose
    defaults a new run takes (`engine.train.presets.VOLUME_KEYS`); None: the voice's own
    data volume decides.
    """

    voice: str | Path
    base: str | None
    settings: dict[str, Any] = field(default_factory=dict)
    use_gpu: bool | None = None
    address: str | None = None
    resume: bool = False
    run: str | None = None
    dry_run: bool = False
    max_failures: int = 2
    verbose: bool = False
    builder: str | None = None
    seed: int | None = None
    storage: str | os.PathLike[str] | None = None
    preflight: bool | None = None
    preset: str | None = None

    @classmethod
    def of(cls, voice: str | Path, base: str | None, **options: Any) -> TrainRequest:
        """A request from keywords: settings by field name, the rest as the fields above."""
        settings = {k: options.pop(k) for k in list(options) if k in SETTINGS}
        return cls(voice, base, {k: v for k, v in settings.items() if v is not None},
                   **options)

    def given(self, name: str) -> Any:
        """The value given for setting `name`, or None."""
        if name not in SETTINGS:
            raise KeyError(name)
        return self.settings.get(name)

    def validated(self) -> TrainRequest:
        """This request, or an InputError naming the first bad value and what to give."""
        for name, value in self.settings.items():
            if name not in SETTINGS:
                raise InputError(f"There is no training setting {name!r}.",
                                 f"Use one of: {', '.join(SETTINGS)}.")
            path = SETTINGS[name]
            why = value_problem(path, value)
            if why is not None:
                rule = rule_of(path)
                hint = f"Use {rule.rule()}." if rule.choices else (
                    f"Give {{{path}}} a value {rule.rule()}, or leave it out." if rule.rule()
                    else None)
                raise InputError(f"{{{path}}} {why}.", hint)
        if self.preset is not None and self.preset not in VOLUME_KEYS:
            raise InputError(f"There is no training preset {self.preset!r}.",
                             f"Use one of: {', '.join(VOLUME_KEYS)}, or leave it out.")
        if self.max_failures < 0:
            raise InputError(f"Worker-group restarts (max_failures) must be at least 0, not "
                             f"{self.max_failures}.")
        if self.given("lora_predictor") and not self.resume and \
                (self.given("trainable") or "talker") != "lora":
            raise InputError("{model.lora_predictor} puts LoRA adapters on the code predictor, "
                             "so it needs {model.trainable} set to lora.",
                             "Choose lora for {model.trainable}, or turn off "
                             "{model.lora_predictor}.")
        if not str(self.base or "").strip() and not self.resume:  # a resume: the run's own
            raise InputError("No base model given.",
                             "Name one for {model.base}: Qwen/Qwen3-TTS-12Hz-0.6B-Base or a "
                             "model folder.")
        return self

    def overrides(self, workers: int, use_gpu: bool | None,
                  threads: int | None) -> dict[str, dict[str, Any]]:
        """The config sections this request sets (given values only; the workers, devices
        and threads as the driver resolved them)."""
        out: dict[str, dict[str, Any]] = {s: {} for s in ("model", "data", "optim", "parallel",
                                                          "run")}
        for name, value in self.settings.items():
            section_name, _ = _split_path(SETTINGS[name])
            out[section_name][name] = value
        out["parallel"].update({"workers": workers, "use_gpu": use_gpu, "address": self.address,
                                "cpu_threads_per_worker": threads})
        if self.seed is not None:
            out["run"]["seed"] = self.seed
        return {k: {n: v for n, v in d.items() if v is not None} for k, d in out.items()}


def _split_path(path: str) -> tuple[str, str]:
    section_name, _, name = path.partition(".")
    return section_name, name
