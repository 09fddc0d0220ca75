"""Talker inputs: the same sequence layout the official `generate` builds.

Layout per row (see docs qwen3-tts-facts.md): the role tokens, then codec
control tags (think/nothink, optional language, speaker slot, pad) summed with
tts_pad/tts_bos on the text channel, then the text. In non-streaming mode
(the official default for custom voices, and the layout fine-tuning trains)
the whole text is in the prompt and the talker then only sees tts_pad; in
streaming mode (the official default for voice cloning) one text token goes
in per generated frame.

Projections are called with the same groupings as the official code (role,
control, text, first token), because a matrix product over a different
number of rows may round differently and greedy decoding must match exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from .decoding import Prefill


def _text_ids(processor: Any, text: str, device: torch.device) -> torch.Tensor:
    wrapped = f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
    ids = processor(text=wrapped, return_tensors="pt", padding=True)["input_ids"]
    ids = ids if ids.dim() == 2 else ids[None]
    return ids.to(device)


@torch.inference_mode()
def build_prefill(model: Any, processor: Any, texts: list[str], speaker: torch.Tensor | None,
                  language_id: int | None, non_streaming: bool) -> Prefill:
    """Prefill for `texts` (one row each), all with the same speaker and language.

    `speaker` is a talker-width vector (a custom voice's embedding row or an
    x-vector); None leaves the speaker slot out, as the official code does.
    """
    talker = model.talker
    cfg = model.config
    tc = cfg.talker_config
    device = talker.codec_head.weight.device
    text_embed = talker.get_text_embeddings()
    codec_embed = talker.get_input_embeddings()

    def project(ids: torch.Tensor) -> torch.Tensor:
        return talker.text_projection(text_embed(ids))

    def codec(ids: list[int]) -> torch.Tensor:
        return codec_embed(torch.tensor([ids], device=device))

    specials = torch.tensor([[cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]],
                            device=device)
    tts_bos, tts_eos, tts_pad = project(specials).chunk(3, dim=1)
    if language_id is None:
        tags = [tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id]
    else:
        tags = [tc.codec_think_id, tc.codec_think_bos_id, language_id, tc.codec_think_eos_id]
    control = [codec(tags)]
    if speaker is not None:
        control.append(speaker.to(device, tts_pad.dtype).view(1, 1, -1))
    control.append(codec([tc.codec_pad_id, tc.codec_bos_id]))
    control_embed = torch.cat(control, dim=1)

    rows: list[torch.Tensor] = []
    trailing: list[torch.Tensor] = []
    for text in texts:
        ids = _text_ids(processor, text, device)
        role = project(ids[:, :3])
        head = torch.cat((tts_pad.expand(-1, control_embed.shape[1] - 2, -1), tts_bos), dim=1)
        head = head + control_embed[:, :-1]
        row = torch.cat((role, head), dim=1)
        body = ids[:, 3:-5]
        if non_streaming:
            text_part = torch.cat((project(body), tts_eos), dim=1)
            text_part = text_part + codec([tc.codec_pad_id] * (body.shape[1] + 1))
            row = torch.cat((row, text_part, tts_pad + codec([tc.codec_bos_id])), dim=1)
            trailing.append(tts_pad)
        else:
            first = project(ids[:, 3:4]) + control_embed[:, -1:]
            row = torch.cat((row, first), dim=1)
            trailing.append(torch.cat((project(ids[:, 4:-5]), tts_eos), dim=1))
        rows.append(row)

    lengths = [r.shape[1] for r in rows]
    width = max(lengths)
    hidden = rows[0].shape[-1]
    embeds = rows[0].new_zeros(len(rows), width, hidden)
    for i, r in enumerate(rows):
        embeds[i, width - r.shape[1]:] = r[0]  # left padding, like the official batch
    t_width = max(t.shape[1] for t in trailing)
    trail = tts_pad.expand(len(rows), t_width, -1).clone()
    for i, t in enumerate(trailing):
        trail[i, : t.shape[1]] = t[0]
    return Prefill(embeds=embeds, lengths=lengths, trailing=trail, tts_pad=tts_pad)
