"""Talker inputs: the same sequence layout the official `generate` builds.

Layout per row (see docs qwen3-tts-facts.md): the role tokens, then codec
control tags (think/nothink, optional language, speaker slot, pad) summed with
tts_pad/tts_bos on the text channel, then the text. In non-streaming mode
(the official default for custom voices, and the layout fine-tuning trains)
the whole text is in the prompt and the talker then only sees tts_pad; in
streaming mode (the official default for voice cloning) one text token goes
in per generated frame.

In-context cloning (a Base model given a reference clip and its transcript,
the official `generate_voice_clone` default) continues the reference: the
text channel carries the reference transcript then the new text, the codec
channel codec_bos then the reference clip's frames (all 16 codebooks' input
embeddings summed per frame). Non-streaming puts the whole text first, then
the frames under tts_pad; streaming sums the two channels position by
position and feeds whatever text is left during generation.

An instruction (custom-voice models that take one) is its own text segment,
`<|im_start|>user ... <|im_end|>`, in front of everything.

Projections are called with the same groupings as the official code (role,
control, text, first token), because a matrix product over a different
number of rows may round differently and greedy decoding must match exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.synth.decoding import Prefill


@dataclass(frozen=True)
class IclPrompt:
    """The reference of in-context cloning: its transcript's token ids and its codec frames."""

    ref_ids: torch.Tensor  # [1, n] transcript tokens, without role tokens
    ref_codes: torch.Tensor  # [T, 16] codec frames of the reference clip


def ref_text_ids(processor: Any, text: str, device: torch.device) -> torch.Tensor:
    """Token ids of a reference transcript, as the official voice clone slices them."""
    wrapped = f"<|im_start|>assistant\n{text}<|im_end|>\n"
    ids = processor(text=wrapped, return_tensors="pt", padding=True)["input_ids"]
    ids = ids if ids.dim() == 2 else ids[None]
    return ids[:, 3:-2].to(device)


def instruct_ids(processor: Any, instruct: str, device: torch.device) -> torch.Tensor:
    wrapped = f"<|im_start|>user\n{instruct}<|im_end|>\n"
    ids = processor(text=wrapped, return_tensors="pt", padding=True)["input_ids"]
    ids = ids if ids.dim() == 2 else ids[None]
    return ids.to(device)


def _ref_codec_embed(model: Any, codes: torch.Tensor) -> torch.Tensor:
    """[1, T, H]: each reference frame's 16 codebook input embeddings, summed."""
    talker = model.talker
    parts = [talker.get_input_embeddings()(codes[:, :1])]
    embeds = talker.code_predictor.get_input_embeddings()
    parts += [embeds[i - 1](codes[:, i:i + 1]) for i in range(1, codes.shape[1])]
    return torch.cat(parts, dim=1).sum(1).unsqueeze(0)


def _text_ids(processor: Any, text: str, device: torch.device) -> torch.Tensor:
    wrapped = f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
    ids = processor(text=wrapped, return_tensors="pt", padding=True)["input_ids"]
    ids = ids if ids.dim() == 2 else ids[None]
    return ids.to(device)


@dataclass
class _Embedder:
    """The talker's two input channels: text ids projected, codec ids embedded; and the
    special text positions (tts_bos, tts_eos, tts_pad), projected together."""

    model: Any
    device: torch.device
    tts_bos: torch.Tensor
    tts_eos: torch.Tensor
    tts_pad: torch.Tensor

    @staticmethod
    def of(model: Any) -> _Embedder:
        talker, cfg = model.talker, model.config
        device = talker.codec_head.weight.device
        specials = torch.tensor([[cfg.tts_bos_token_id, cfg.tts_eos_token_id,
                                  cfg.tts_pad_token_id]], device=device)
        tts_bos, tts_eos, tts_pad = talker.text_projection(
            talker.get_text_embeddings()(specials)).chunk(3, dim=1)
        return _Embedder(model, device, tts_bos, tts_eos, tts_pad)

    @property
    def tc(self) -> Any:
        return self.model.config.talker_config

    def project(self, ids: torch.Tensor) -> torch.Tensor:
        talker = self.model.talker
        return talker.text_projection(talker.get_text_embeddings()(ids))

    def codec(self, ids: list[int]) -> torch.Tensor:
        return self.model.talker.get_input_embeddings()(torch.tensor([ids], device=self.device))

    def control(self, speaker: torch.Tensor | None, language_id: int | None) -> torch.Tensor:
        """The codec control tags: think/nothink with the language, the speaker slot, pad
        and bos."""
        tc = self.tc
        if language_id is None:
            tags = [tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id]
        else:
            tags = [tc.codec_think_id, tc.codec_think_bos_id, language_id, tc.codec_think_eos_id]
        control = [self.codec(tags)]
        if speaker is not None:
            control.append(speaker.to(self.device, self.tts_pad.dtype).view(1, 1, -1))
        control.append(self.codec([tc.codec_pad_id, tc.codec_bos_id]))
        return torch.cat(control, dim=1)


def _icl_row(emb: _Embedder, row: torch.Tensor, text_ids: torch.Tensor, ref_frames: torch.Tensor,
             non_streaming: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """An in-context row continued: the reference transcript and the text over the
    reference frames; (row, text still to feed). `text_ids`: transcript + text."""
    # one projection over transcript + text, as the official call groups it
    joined = torch.cat((emb.project(text_ids), emb.tts_eos), dim=1)
    n_text, n_codec = joined.shape[1], ref_frames.shape[1]
    if non_streaming:
        joined = joined + emb.codec([emb.tc.codec_pad_id] * n_text)
        return torch.cat((row, joined, ref_frames + emb.tts_pad), dim=1), emb.tts_pad
    if n_text > n_codec:
        return (torch.cat((row, joined[:, :n_codec] + ref_frames), dim=1),
                joined[:, n_codec:])
    joined = torch.cat((joined, emb.tts_pad.expand(-1, n_codec - n_text, -1)), dim=1)
    return torch.cat((row, joined + ref_frames), dim=1), emb.tts_pad


def _plain_row(emb: _Embedder, row: torch.Tensor, ids: torch.Tensor, control_embed: torch.Tensor,
               non_streaming: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A row without a reference: the whole text in the prompt (non-streaming) or its
    first token, the rest fed during generation; (row, text still to feed)."""
    if non_streaming:
        body = ids[:, 3:-5]
        text_part = torch.cat((emb.project(body), emb.tts_eos), dim=1)
        text_part = text_part + emb.codec([emb.tc.codec_pad_id] * (body.shape[1] + 1))
        row = torch.cat((row, text_part, emb.tts_pad + emb.codec([emb.tc.codec_bos_id])), dim=1)
        return row, emb.tts_pad
    first = emb.project(ids[:, 3:4]) + control_embed[:, -1:]
    return (torch.cat((row, first), dim=1),
            torch.cat((emb.project(ids[:, 4:-5]), emb.tts_eos), dim=1))


def _left_padded(rows: list[torch.Tensor], trailing: list[torch.Tensor],
                 tts_pad: torch.Tensor) -> Prefill:
    """The rows in one batch, left-padded like the official batch; the text still to feed
    right-padded with tts_pad."""
    lengths = [r.shape[1] for r in rows]
    width = max(lengths)
    hidden = rows[0].shape[-1]
    embeds = rows[0].new_zeros(len(rows), width, hidden)
    for i, r in enumerate(rows):
        embeds[i, width - r.shape[1]:] = r[0]
    t_width = max(t.shape[1] for t in trailing)
    trail = tts_pad.expand(len(rows), t_width, -1).clone()
    for i, t in enumerate(trailing):
        trail[i, : t.shape[1]] = t[0]
    return Prefill(embeds=embeds, lengths=lengths, trailing=trail, tts_pad=tts_pad)


@torch.inference_mode()
def build_prefill(model: Any, processor: Any, texts: list[str], speaker: torch.Tensor | None,
                  language_id: int | None, non_streaming: bool, icl: IclPrompt | None = None,
                  instruct: torch.Tensor | None = None) -> Prefill:
    """Prefill for `texts` (one row each), all with the same speaker and language.

    `speaker` is a talker-width vector (a custom voice's embedding row or an
    x-vector); None leaves the speaker slot out, as the official code does.
    `icl`: continue this reference clip (in-context cloning). `instruct`:
    instruction token ids (`instruct_ids`) put in front of every row.
    """
    emb = _Embedder.of(model)
    device = emb.device
    control_embed = emb.control(speaker, language_id)
    ref_frames = None
    if icl is not None:
        ref_frames = torch.cat((emb.codec([emb.tc.codec_bos_id]),
                                _ref_codec_embed(model, icl.ref_codes.to(device))), dim=1)
    lead = emb.project(instruct.to(device)) if instruct is not None else None
    rows: list[torch.Tensor] = []
    trailing: list[torch.Tensor] = []
    for text in texts:
        ids = _text_ids(processor, text, device)
        role = emb.project(ids[:, :3])
        head = torch.cat((emb.tts_pad.expand(-1, control_embed.shape[1] - 2, -1), emb.tts_bos),
                         dim=1)
        row = torch.cat((role, head + control_embed[:, :-1]), dim=1)
        if icl is not None and ref_frames is not None:
            ref_and_text = torch.cat((icl.ref_ids.to(device), ids[:, 3:-5]), dim=-1)
            row, rest = _icl_row(emb, row, ref_and_text, ref_frames, non_streaming)
        else:
            row, rest = _plain_row(emb, row, ids, control_embed, non_streaming)
        rows.append(row if lead is None else torch.cat((lead, row), dim=1))
        trailing.append(rest)
    return _left_padded(rows, trailing, emb.tts_pad)
