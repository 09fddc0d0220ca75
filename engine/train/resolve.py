"""What a run trains with, decided before anything starts: the voice's data and whether it
is enough, the devices and worker threads, the config (its layers merged:
`resolve_config`), and the runs a resume may not go on with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from engine.config.layers import Layer, Merged, merge
from engine.config.train import TrainConfig
from engine.core.errors import InputError, TrainingError
from engine.core.events import Emitter
from engine.data.dataset import VoiceData, split_ids
from engine.layout.manifest import prepared_folder, read_manifest
from engine.layout.run import Run
from engine.train.gpus import visible_gpus


@dataclass
class DataSummary:
    clips: int
    seconds: float
    ids: tuple[str, ...] = ()

    def train_clips(self, cfg: TrainConfig) -> int:
        """Clips left for training after the validation split (the dataset's own rule)."""
        train_ids, _ = split_ids(list(self.ids), cfg.data.val_fraction, cfg.data.val_min,
                                 cfg.data.seed)
        return len(train_ids)

    @property
    def minutes(self) -> float:
        return self.seconds / 60.0


def data_summary(voice_dir: Path) -> DataSummary:
    """Usable clips and their total duration, from the prepare manifest."""
    if not prepared_folder(voice_dir).manifest.exists():
        raise InputError(f"{voice_dir.name} has no prepared clips.",
                         f"Run `voxshard-engine prepare {voice_dir}` first.")
    clips = read_manifest(voice_dir)
    seconds = sum(float(c.get("duration_s", 0.0)) for c in clips)
    return DataSummary(len(clips), seconds, tuple(str(c.get("id")) for c in clips))


def resolve_config(layers: Sequence[Layer], summary: DataSummary, run_name: str
                   ) -> tuple[TrainConfig, Merged]:
    """A run's config: each setting from the first of `layers` that gives it
    (`engine.config.layers.merge`), then the rules that follow from the rest, each with its
    source: the run's name from its folder, adapters on the code predictor for LoRA runs
    alone, and a batch no person chose fitted to the worker count and the training clips."""
    merged = merge(TrainConfig, layers)
    if merged.get("model.trainable") != "lora" and merged.get("model.lora_predictor"):
        # the voice's [train] lora_predictor is for its LoRA runs
        merged.set("model.lora_predictor", False, "model.trainable, which is not lora")
    merged.set("run.name", run_name, "the run's folder")
    try:
        cfg = TrainConfig.from_dict(merged.tree)
    except ValueError as exc:
        raise InputError(f"Bad training setting: {exc}.") from exc
    if "data.batch_size" not in merged.chosen:
        # every worker needs a clip per micro-step, and one optimizer step must
        # fit in the training clips
        fit = summary.train_clips(cfg) // cfg.data.grad_accum
        batch = max(cfg.parallel.workers, min(cfg.data.batch_size, fit))
        if batch != cfg.data.batch_size:
            merged.set("data.batch_size", batch,
                       f"{merged.provenance['data.batch_size']}, fitted to "
                       f"{cfg.parallel.workers} worker(s) and {summary.train_clips(cfg)} "
                       "training clips")
            cfg = cfg.replace(data={"batch_size": batch})
    return cfg, merged


def new_run_name() -> str:
    return datetime.now(UTC).strftime("run-%Y%m%d-%H%M%S")



def worker_threads(use_gpu: bool | None, cpu_offload: bool, workers: int,
                   cores: int) -> int | None:
    """Torch threads per worker (and Ray CPUs per worker); None keeps the config's default.

    CPU workers share this machine's cores: each gets its share (one per worker
    would leave cores idle). So do GPU workers under CPU offload, whose AdamW
    step runs on the host: on one thread it took 12.6 s for 1.6B parameters.
    """
    if use_gpu is False or (use_gpu and cpu_offload):
        return max(1, cores // max(1, workers))
    return None


def detect_gpus(address: str | None) -> int:
    """GPUs training could use (CUDA_VISIBLE_DEVICES honoured), without starting CUDA here."""
    if address is not None:
        return -1  # decided by the cluster's resources once connected

    return len(visible_gpus())

def refuse_finished(run: Run, steps: int | None) -> None:
    """A resume of a run already trained to its last step would start Ray to do nothing."""
    if steps is not None and run.finished(steps):
        raise InputError(f"The run {run.name} has already trained all its {steps} steps, so "
                         "there is nothing to resume.",
                         "Ask for more steps to continue it, or start a new run.")


def resume_base(run: Run, given: str | None) -> str:
    """The base model a resumed run trains on: the one it started from (its saved config,
    else its newest checkpoint's), whatever base the caller names now (the window's form
    may show another); `given` only for a run that records none. A different `given` is
    not an error: the run's own checkpoints fit its own base alone."""
    own = run.base_model()
    if own:
        return own
    if not str(given or "").strip():
        raise InputError(f"The run {run.name} does not record its base model.",
                         "Name it for {model.base}: the model the run started from.")
    return str(given)


def refuse_reinforced(run: Run) -> None:
    """A run the reinforce stage went on from cannot resume training (`Run.resume_refusal`,
    which the window asks before offering Resume)."""
    refusal = run.resume_refusal()
    if refusal is not None:
        raise refusal


def steps_per_epoch(cfg: TrainConfig, voice_dir: Path, model_dir: Path,
                    emitter: Emitter) -> int:
    """Optimizer steps in one pass over the training clips (train-core's dataset decides)."""
    data = VoiceData.open(voice_dir, model_dir, cfg.data)
    try:
        data.check(cfg.parallel.workers)
    except TrainingError as exc:  # too little data for this batch/worker shape
        raise InputError(exc.message, exc.hint) from exc
    return int(data.steps_per_epoch())

