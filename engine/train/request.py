"""`TrainRequest`: what one start of training was asked for, from the CLI, the API or the app.

Its settings are the config's own (`engine.config.train.REQUEST_SETTINGS`), named by
field and checked against the schema's rules (`engine.config.schema`), so a setting's
name, bounds and words live in its config field and nowhere here. Light: no torch.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config.layers import checked
from engine.config.schema import by_name, rule_of, value_problem
from engine.config.train import REQUEST_SETTINGS, TrainConfig
from engine.core.errors import InputError
from engine.train.presets import VOLUME_KEYS

#: {field name: "section.field"} of every setting a request may give
SETTINGS: dict[str, str] = by_name(REQUEST_SETTINGS)


@dataclass(frozen=True)
class TrainRequest:
    """What the user asked for: the same object from the CLI, the Python API and the app.

    `settings` holds the config settings given, by field name (workers, steps, lr,
    trainable, predictor_frames, ...: `SETTINGS`) or, any setting of the training config,
    by its path ("optim.weight_decay": `--set`); one left out or None is "not given":
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
    data volume decides. config: a file holding a whole config (JSON or TOML, a run's
    config.json too) whose settings come after the request's (`engine.config.layers`).
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
    config: str | os.PathLike[str] | None = None

    @classmethod
    def of(cls, voice: str | Path, base: str | None, **options: Any) -> TrainRequest:
        """A request from keywords: settings by field name (and `settings`, by path), the
        rest as the fields above."""
        settings = dict(options.pop("settings", None) or {})
        settings.update({k: options.pop(k) for k in list(options) if k in SETTINGS})
        return cls(voice, base, {k: v for k, v in settings.items() if v is not None},
                   **options)

    def given(self, name: str) -> Any:
        """The value given for setting `name`, or None."""
        if name not in SETTINGS:
            raise KeyError(name)
        return self.settings.get(name)

    def validated(self) -> TrainRequest:
        """This request, or an InputError naming the first bad value and what to give; a
        setting given by the path of one of `SETTINGS` is kept by its name."""
        names = {path: name for name, path in SETTINGS.items()}
        by_path = {k: v for k, v in self.settings.items() if "." in k}
        for path, value in by_path.items():
            checked(path, value, TrainConfig, "The request")
        settings = {names.get(k, k): v for k, v in self.settings.items()}
        if settings != self.settings:
            return dataclasses.replace(self, settings=settings).validated()
        for name, value in self.settings.items():
            if "." in name:
                continue  # checked above
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
        if not str(self.base or "").strip() and not self.resume and self.config is None:
            # a resume: the run's own; a config file: its own
            raise InputError("No base model given.",
                             "Name one for {model.base}: Qwen/Qwen3-TTS-12Hz-0.6B-Base or a "
                             "model folder.")
        return self

    def values(self) -> dict[str, Any]:
        """The settings this request gives, by path (`engine.config.layers`)."""
        out = {SETTINGS.get(k, k): v for k, v in self.settings.items()}
        out.update({"parallel.address": self.address, "parallel.use_gpu": self.use_gpu,
                    "run.seed": self.seed})
        return {k: v for k, v in out.items() if v is not None}
