"""Export: a run's checkpoint written as a voice that speaks without the trainer, either an
official custom-voice folder or (a LoRA run) an adapter voice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.config.train import TrainConfig
from engine.core.errors import InputError, VoxshardError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.core.kinds import Tier
from engine.core.storage import user_path
from engine.data.dataset import VoiceData
from engine.layout.run import pick_run
from engine.layout.tiers import run_adapter_dir
from engine.layout.voice import open_voice
from engine.model.adapter import AdapterRequest, export_adapter
from engine.model.checkpoint_weights import checkpoint_tensors, trained_weights
from engine.model.export import export_custom_voice
from engine.model.loading import resolve_model
from engine.train.rundata import run_x_vector


def export(voice: str | Path, out_dir: Path, *, run: str | None = None, step: int | None = None,
           name: str | None = None, adapter: bool = False, peft: bool = False,
           on_event: EventCallback | Emitter | None = None) -> dict[str, Any]:
    """Write checkpoint `step` of a run as an official custom-voice folder; by default the
    checkpoint the run's evaluation judged best (`evaluate`), else the latest. With
    `adapter`, a LoRA run's adapters and speaker row alone (an adapter voice,
    `engine.model.adapter`), and with `peft` also in PEFT's folder format.

    Runs in this process, no Ray, no process group: DCP reads every shard and
    reassembles full tensors. Frozen weights come from the base model, the
    trained ones from the checkpoint (a LoRA run's adapters merged into their
    weights, `trained_weights`: the same tensors speaking from the run loads).
    """
    emitter = as_emitter(on_event)
    v = open_voice(voice)
    found = pick_run(v.path, run, with_checkpoint=True)
    if found is None:
        raise InputError(f"{v.display_name} has no training run"
                         + (f" {run}." if run else " with a checkpoint."),
                         "Train first with `voxshard-engine train`.",
                         window_hint="Press Start training first.")
    run_dir = found.path
    if step is None:
        ckpt = found.best()
        if ckpt is not None:
            emitter.log(f"Exporting {ckpt.name}, the best checkpoint of the evaluation "
                        "(give --step for another).")
        else:
            ckpt = found.latest()
    else:
        ckpt = found.checkpoint(step)
    if ckpt is None:
        steps = ", ".join(str(s) for s in found.steps())
        raise InputError(f"Run {run_dir.name} has no complete checkpoint"
                         + (f" at step {step}." if step is not None else "."),
                         f"Pick another --step ({steps}) or --run." if steps
                         else "Pick another --run.",
                         window_hint="Choose another run in the Run list above the charts, "
                                     "then press Export model again.")
    cfg = TrainConfig.from_dict(found.read_config())
    model_dir = resolve_model(cfg.model.base, on_event=emitter)
    emitter.state("exporting", detail=f"{run_dir.name}/{ckpt.name}")
    x_vector = run_x_vector(run_dir)
    if x_vector is None:  # a run from before the run kept its own copy
        x_vector = VoiceData.open(v.path, model_dir, cfg.data).x_vector
    speaker = (name or cfg.model.speaker_name or v.speaker).strip().lower()
    if adapter or peft:
        out = export_adapter(AdapterRequest(
            checkpoint_tensors(ckpt), model_dir, cfg.model.base, cfg.model.lora_rank,
            cfg.model.lora_alpha, speaker, x_vector,
            {"run": run_dir.name, "checkpoint": ckpt.name,
             "styles": found.trained_styles()}, peft=peft), user_path(out_dir),
            # the run's own adapter voice (written when it finished) is the run's to replace
            overwrite=user_path(out_dir) == user_path(run_adapter_dir(v.path, run_dir.name)))
        emitter.artifact(str(out), "adapter")
        return {"out_dir": str(out), "run": run_dir.name, "checkpoint": ckpt.name,
                "speaker": speaker, "tier": Tier.ADAPTER,
                "summary": f"Exported {run_dir.name}/{ckpt.name} as the adapter voice "
                           f"'{speaker}' on {cfg.model.base} to {out}."}
    # the rest of the tensors come from the base (export_custom_voice)
    trained = trained_weights(ckpt, model_dir, cfg.model.lora_scaling)
    out = export_custom_voice(model_dir, trained, speaker, x_vector, user_path(out_dir),
                              info={"run": run_dir.name, "checkpoint": ckpt.name,
                                    "styles": found.trained_styles()})
    emitter.artifact(str(out), "model")
    return {"out_dir": str(out), "run": run_dir.name, "checkpoint": ckpt.name,
            "speaker": speaker,
            "summary": f"Exported {run_dir.name}/{ckpt.name} as voice '{speaker}' to {out}."}


def write_adapter_voice(voice: Path, run: str, emitter: Emitter, what: str
                        ) -> dict[str, Any] | None:
    """A finished LoRA run's (or its reinforce stage's: `what`) adapter voice, ready to
    speak: its checkpoint (the evaluation's best, else the last) written as `export
    --adapter` writes it into the voice's exports/ (replacing the run's own). The run
    itself stands when this fails: the warning says why, and `export --adapter` can try
    again."""
    out_dir = run_adapter_dir(voice, run)
    try:
        return export(voice, out_dir, run=run, adapter=True, on_event=emitter)
    except VoxshardError as exc:
        emitter.log(f"The {what} finished, but the run's adapter voice was not written: "
                    f"{exc.message} Write it with `voxshard-engine export {voice} {out_dir} "
                    f"--run {run} --adapter`.", level="warning")
        return None

