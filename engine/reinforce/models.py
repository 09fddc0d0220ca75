"""What the stage loads, in one process or in its Ray rollout actor: the official model
with a checkpoint's weights, the policy around its talker (the decoder reads the same
weights), a frozen copy of it as the reference, and the roller that renders from it.

A LoRA run's policy is its adapters on the frozen base, as training has them: the base's
weights load unmerged, the talker gets the run's adapters (its rank and alpha), filled with
the start checkpoint's, and only they train; the reference is a frozen copy of the start."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.audio.timebase import SAMPLE_RATE
from engine.config.train import ModelConfig, TrainConfig
from engine.core.errors import InputError
from engine.core.kinds import VoiceKind
from engine.data.layout import LayoutIds
from engine.layout.run import Run
from engine.layout.voice import Voice
from engine.model.checkpoint_weights import checkpoint_tensors
from engine.model.loading import load_model, read_model_config, resolve_model
from engine.reinforce.reward import Scorer
from engine.reinforce.rollout import Render, Roller
from engine.reinforce.stage import frozen_copy
from engine.synth.voice import VoiceSource, load_checkpoint_weights, voice_x_vector
from engine.train.lora import add_lora
from engine.train.objective import VoiceObjective, set_trainable


@dataclass
class StageModels:
    model: Any  # the official model; its talker is the policy's
    policy: VoiceObjective
    reference: VoiceObjective
    roller: Roller

    def score(self, scorer: Scorer, renders: list[Render], texts: list[str]
              ) -> list[dict[str, float]]:
        """The renders decoded by the model's codec and scored (reward and its terms); a
        render the runaway guard cut is penalised as a capped one (it never ended)."""
        waves = self.roller.audio(renders)
        return [scorer.score(w, SAMPLE_RATE, texts[r.prompt], r.unended, r.style)
                for r, w in zip(renders, waves, strict=True)]


def _lora_config(run: Run) -> ModelConfig:
    """The run's adapters (rank, alpha); adapters the rollouts cannot apply refused."""
    model = TrainConfig.from_dict(run.config()).model
    if model.lora_predictor:
        raise InputError(f"The run {run.name} trained LoRA adapters on the code predictor "
                         "too, which the reinforce stage's renders cannot apply yet.",
                         "Reinforce a run whose adapters are on the talker only.")
    return model


def _load_adapters(model: Any, start: Any) -> None:
    """Checkpoint `start`'s tensors, unmerged, into `model` (its adapters and anything else
    the run trained), by official name."""
    params = dict(model.named_parameters())
    tensors = checkpoint_tensors(start, {n: tuple(p.shape) for n, p in params.items()})
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))


def load_stage_models(voice: Voice, run: Run, start: Any, trainable: str, device: str,
                      seed: int) -> StageModels:
    """The run's base model with checkpoint `start`'s weights, on `device` in fp32."""
    base_dir = resolve_model(str(run.base_model()), download=False)
    torch.manual_seed(int(seed))
    wrapper = load_model(base_dir, device=device, dtype=torch.float32)
    model = wrapper.model
    scaling = None
    if trainable == "lora":
        lora = _lora_config(run)
        add_lora(model.talker, lora.lora_rank, lora.lora_alpha)
        scaling = lora.lora_scaling
        _load_adapters(model, start)
    else:
        load_checkpoint_weights(model, VoiceSource(kind=VoiceKind.CHECKPOINT, model_dir=base_dir,
                                                   label="start", checkpoint=start))
    policy = VoiceObjective(model.talker)
    set_trainable(policy, trainable)
    policy.train()
    reference = frozen_copy(policy)
    config = read_model_config(base_dir)
    speaker = torch.as_tensor(voice_x_vector(model, voice.path)).float().reshape(-1)
    roller = Roller(model, wrapper.processor, wrapper.processor.tokenizer, speaker,
                    LayoutIds.from_config(config), lora_scaling=scaling,
                    styles=run.trained_styles())
    return StageModels(model, policy, reference, roller)
