"""The official model beside ours, for layout parity tests.

- `load_official`: the official `Qwen3TTSModel` of a model folder (fp32, sdpa).
- `official_generate`: greedy official `generate` with an x-vector speaker and no
  language (the custom-voice prompt), optionally with an instruction or a reference clip
  to continue (in-context cloning), in either text layout, recording every input
  embedding it feeds the talker; forced to `frames` frames.
- `loaded_objective`: our training objective with the folder's base weights, and its ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from engine.data.layout import LayoutIds
from engine.train.objective import VoiceObjective, build_objective, load_base_weights


def load_official(model_dir: Path) -> Any:
    from engine.model.official import import_qwen_tts

    qt = import_qwen_tts()
    return qt.Qwen3TTSModel.from_pretrained(str(model_dir), dtype=torch.float32,
                                            attn_implementation="sdpa")


def official_generate(official: Any, text: str, x_vector: torch.Tensor, frames: int,
                      instruct: str | None = None,
                      reference: tuple[str, torch.Tensor] | None = None,
                      non_streaming: bool = True) -> dict[str, Any]:
    """{"codes" (frames, 16), "hidden" (frames, D) before each frame, "inputs" (L-1, D)}.

    `reference`: (transcript, codec frames [T, 16]) of a clip to continue (in-context
    cloning, as `generate_voice_clone` prompts it)."""
    model = official.model
    input_ids = official._tokenize_texts([official._build_assistant_text(text)])[0]
    instruct_ids = None
    if instruct is not None:
        instruct_ids = [official._tokenize_texts([official._build_instruct_text(instruct)])[0]]
    ref_ids = None
    if reference is not None:
        ref_ids = [official._tokenize_texts([official._build_ref_text(reference[0])])[0]]
    fed: list[torch.Tensor] = []

    def record(_mod: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        fed.append(kwargs["inputs_embeds"].detach().clone())

    handle = model.talker.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        codes, hidden = model.generate(
            input_ids=[input_ids], instruct_ids=instruct_ids, ref_ids=ref_ids,
            voice_clone_prompt={"ref_spk_embedding": [x_vector],
                                "x_vector_only_mode": [reference is None],
                                "icl_mode": [reference is not None],
                                "ref_code": None if reference is None else [reference[1]]},
            languages=["auto"], non_streaming_mode=non_streaming, max_new_tokens=frames + 1,
            do_sample=False, subtalker_dosample=False, repetition_penalty=1.0,
            # bos is suppressed, so generation never stops early: fixed length
            eos_token_id=model.config.talker_config.codec_bos_id,
        )
    finally:
        handle.remove()
    return {"codes": codes[0], "hidden": hidden[0], "inputs": torch.cat(fed, dim=1)[0]}


def loaded_objective(model_dir: Path) -> tuple[VoiceObjective, LayoutIds, int]:
    """(objective with base weights on the CPU, layout ids, talker width)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    objective = build_objective(model_dir, device="meta")
    load_base_weights(objective, model_dir, "cpu")
    return objective, LayoutIds.from_config(cfg), int(cfg["talker_config"]["hidden_size"])
