"""Renders sampled from the policy, and their layout for scoring.

The policy's talker is the official one inside the training objective; the engine's
decoder (`FastTalker`) reads its weights in place, so every rollout samples from the
policy as it is now, with no copy. Sampling is the model's own distribution
(temperature 1, no top-k or top-p, no repetition penalty), so the log-probabilities
the objective gives the codes are those of the policy that chose them; only the
control codes the decoder never emits (and end of speech before two frames) are left
out of its choice, as in every render.

A render cut at the length cap never chose to end: its layout scores no end of speech
(a penalised capped render must not push the end of speech down), and `audio` decodes
renders with the model's own codec for scoring. Rollouts run under the runaway guard of
every render (`engine.synth.runaway`, `SpeakOptions`' default limits): a row that loops or
stays silent ends there with its reason (`Render.runaway`); it never chose to end either,
so it is laid out and penalised as a capped one.

A prompt may carry an instruction (one of the run's trained styles,
`stage.iteration_styles`): its renders are sampled with the instruction where speaking
puts one, and laid out with it where training puts it (the same tokens), as context only.

A LoRA policy (`lora_scaling` given) keeps its adapters unmerged on the frozen base: before
each rollout they are written, as they are now, into one slot of the decoder's adapter pool
(`engine.synth.adapters`), and every row renders with that slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from engine.config.speak import SpeakOptions
from engine.data.layout import LayoutIds, build_sequence, collate, tokenize, tokenize_instruct
from engine.synth.decoding import DecodeSettings, FastTalker
from engine.synth.prompt import build_prefill, instruct_ids
from engine.synth.runaway import RunawayGuard, silence_codes, stop_reason
from engine.synth.sampling import SamplerSettings
from engine.train.lora import is_lora_name
from engine.train.objective import batch_to_device

#: the policy's own distribution: what GRPO's ratios assume
PLAIN = SamplerSettings(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
ROLLOUT = DecodeSettings(talker=PLAIN, predictor=PLAIN, repetition_penalty=1.0)


@dataclass
class Render:
    prompt: int  # index of its text
    codes: np.ndarray  # (frames, 16) int64
    capped: bool = False  # cut at the length cap (the policy never ended it)
    runaway: str | None = None  # cut by the runaway guard: "loop" or "silence"
    style: str | None = None  # the instruction its prompt carried (a trained style)

    @property
    def unended(self) -> bool:
        """The policy never chose to end it (the cap or the guard did)."""
        return self.capped or self.runaway is not None


def rollout_guard(model: Any) -> RunawayGuard | None:
    """The runaway guard of every render (`SpeakOptions`' limits) for `model`'s codec."""
    options = SpeakOptions()
    return RunawayGuard.of(options.runaway_loop_s, options.runaway_silence_s,
                           silence_codes(model))


class Roller:
    """Samples groups of renders from a loaded official model (`wrapper.model`) whose
    talker the policy shares."""

    def __init__(self, model: Any, processor: Any, tokenizer: Any, speaker: torch.Tensor,
                 ids: LayoutIds, lora_scaling: float | None = None,
                 styles: Sequence[str] = ()) -> None:
        self.model, self.processor, self.tokenizer = model, processor, tokenizer
        #: the styles the run trained with (what a prompt's instruction may be)
        self.styles = list(styles)
        self.speaker = speaker
        self.ids = ids
        self.fast = FastTalker(model)
        self.settings = replace(ROLLOUT, guard=rollout_guard(model))
        self.lora_scaling = lora_scaling
        self._slot: int | None = None

    def _adapter_rows(self, rows: int) -> list[int] | None:
        """The policy's adapters as they are now in the pool; each row's slot (None: a
        policy without adapters)."""
        if self.lora_scaling is None:
            return None
        tensors = {f"talker.{n}": p.detach() for n, p in self.model.talker.named_parameters()
                   if is_lora_name(n)}
        if self._slot is not None:  # written again: the update changed them
            self.fast.adapters.release(self._slot)
        self._slot = self.fast.adapters.add("policy", tensors, self.lora_scaling,
                                            "the policy")
        return [self._slot] * rows

    def sample(self, texts: list[str], group: int, max_frames: int, seed: int,
               styles: Sequence[str | None] | None = None) -> list[Render]:
        """`group` renders of each text, prompt by prompt (seeded: a resumed stage draws
        the same renders); `styles[p]`: the instruction of prompt p (None: plain), put
        where speaking puts one (`speak --instruct`)."""
        renders: list[Render] = []
        slots = self._adapter_rows(group)
        guard = self.settings.guard
        for p, text in enumerate(texts):
            style = styles[p] if styles is not None else None
            instruct = (instruct_ids(self.processor, style, self.fast.device) if style
                        else None)
            prefill = build_prefill(self.model, self.processor, [text] * group, self.speaker,
                                    None, non_streaming=True, instruct=instruct)
            seeds = [seed * 1000 + p * group + g for g in range(group)]
            codes = self.fast.generate(prefill, [max_frames] * group, self.settings,
                                       seeds=seeds, adapters=slots)
            for c in codes:
                kept = c.cpu().numpy().astype(np.int64)
                runaway = stop_reason(kept[:, 0].tolist(), guard)
                renders.append(Render(p, kept, runaway is None and len(kept) >= max_frames,
                                      runaway, style or None))
        return renders

    def audio(self, renders: list[Render], group: int = 8) -> list[np.ndarray]:
        """The renders as 24 kHz waveforms by the model's codec, `group` per call."""
        waves: list[np.ndarray] = [np.zeros(0, dtype=np.float32) for _ in renders]
        todo = [i for i, r in enumerate(renders) if len(r.codes)]
        with torch.inference_mode():
            for start in range(0, len(todo), group):
                picked = todo[start:start + group]
                items = [{"audio_codes": torch.from_numpy(renders[i].codes)} for i in picked]
                wavs, _sr = self.model.speech_tokenizer.decode(items)
                for i, wav in zip(picked, wavs, strict=True):
                    waves[i] = np.asarray(wav, dtype=np.float32).reshape(-1)
        return waves

    def batch(self, texts: list[str], renders: list[Render], device: Any
              ) -> dict[str, torch.Tensor]:
        """The renders laid out as training clips of their texts, on `device`."""
        seqs = []
        for r in renders:
            role, text = tokenize(self.tokenizer, texts[r.prompt])
            # its instruction is context, as in training: the layout never targets it
            instruct = tokenize_instruct(self.tokenizer, r.style) if r.style else ()
            seq = build_sequence(self.ids, role, text, r.codes, instruct)
            if r.unended:  # the end of speech after its last frame was never sampled
                seq.target_mask[int(np.flatnonzero(seq.frame_mask)[-1]) + 1] = False
            seqs.append(seq)
        out = collate(seqs, self.ids)
        out["x_vector"] = self.speaker.detach().float().cpu().numpy()[None].repeat(
            len(renders), 0)
        return batch_to_device(out, device)
