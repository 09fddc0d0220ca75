"""Our decoding loop over the official Qwen3-TTS modules.

The official `generate` runs Hugging Face `generate` for the talker and, inside
every talker step, a second `generate` for the 15 sub-codebooks: per codec
frame that is 16 trips through the generation machinery (logits processors,
stopping criteria, cache objects, mask builders) on top of the actual layer
math. On small models the machinery is nearly all of the time; on larger ones
the code predictor's 15 sequential passes are bound by reading its weights.

Here the same weights are called directly:
- key/value caches are preallocated once per request ([B, kv_heads, T, d] per
  layer), written in place, never concatenated or re-allocated;
- rotary tables are computed once by the official rotary modules;
- no attention mask is built when no row is padded (the common single-chunk
  case), as the official sdpa path does;
- several chunks of a long text share one batch, so each weight read serves
  all of them (what makes long text fast on a memory-bound CPU);
- sampling draws only over the top-k candidates, with noise computed on the
  device from (seed + chunk, frame, codebook, candidate) (`FrameNoise`: a
  chunk sounds the same whatever shares its batch, and no noise is drawn on
  the host or copied per frame);
- the end-of-speech check is the only host sync, every `sync_every` frames.
On CUDA the frame loop runs with static shapes (`rows.RowBatch`, reused per
batch shape) and each frame is captured once per attention span as a CUDA
graph and replayed, which removes the per-kernel launch cost that dominates
small decoding steps on a GPU. The same static frame runs uncaptured on the
CPU in the tests, which also check it makes no host sync and no host tensor.

Layer math mirrors the official modules op for op (same RMSNorm, rotary and
sdpa calls, same grouping of projections), so greedy decoding produces the
official codes exactly; tests/test_synth_greedy.py proves it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from engine.core.errors import ModelError
from engine.synth.adapters import (
    DOWN_PROJ,
    GATE_PROJ,
    K_PROJ,
    O_PROJ,
    Q_PROJ,
    UP_PROJ,
    V_PROJ,
    Adapters,
    RowAdapters,
)
from engine.synth.quant import PACKED, check_mode, convert_layers, linear
from engine.synth.rows import RowBatch, bucket, settings_key
from engine.synth.runaway import RunawayGuard, RunawayWatch
from engine.synth.sampling import FrameNoise, SamplerSettings, choose, noise_width, row_keys
from engine.text import max_frames_for

# How many positions the official code feeds the code predictor per frame:
# the talker state, codebook 0, then codebooks 1..14 (codebook 15 is only
# produced, never fed back).
PREDICTOR_POSITIONS = 16


@dataclass(frozen=True)
class DecodeSettings:
    talker: SamplerSettings = field(default_factory=SamplerSettings)
    predictor: SamplerSettings = field(default_factory=SamplerSettings)
    repetition_penalty: float = 1.05
    #: frames that must pass before end-of-speech may be chosen (official: 2 tokens)
    min_new_tokens: int = 2
    #: check for end-of-speech every N frames (1 on CPU; larger saves GPU syncs)
    sync_every: int = 1
    #: False bans end-of-speech like the other control codes, so every row runs
    #: to its cap: fixed-length generation for benchmarks, never for speech
    stop_at_eos: bool = True
    #: the runaway guard (`runaway`): a row whose codes loop or stay silent ends early,
    #: decided on the host from the codes the end-of-speech check copies back
    guard: RunawayGuard | None = None

    def __post_init__(self) -> None:
        if not self.repetition_penalty > 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.sync_every < 1:
            raise ValueError("sync_every must be >= 1")


@dataclass
class Prefill:
    """Talker inputs for a batch, left-padded like the official batch path."""

    embeds: torch.Tensor  # [B, T, H]
    lengths: list[int]  # real (unpadded) length of each row
    trailing: torch.Tensor  # [B, Tt, H] text still to feed, padded with tts_pad
    tts_pad: torch.Tensor  # [1, 1, H]


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same op sequence as the official Qwen3TTSRMSNorm (float32 statistics,
    # normalised value rounded to the input dtype before the weight).
    if x.dtype == torch.float32:
        # the fused kernel is bit-identical to that sequence in float32 (checked
        # by the greedy-equality tests) and costs one dispatch instead of six
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


KV = tuple[torch.Tensor, torch.Tensor]


def _grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                       mask: torch.Tensor, scale: float, n_rep: int) -> torch.Tensor:
    """Masked attention where each K/V head serves `n_rep` query heads, without
    copying K/V: the query heads of a group become extra query rows of their
    K/V head (the mask is per key, the same for all of them). Any sdpa
    backend runs it; `enable_gqa` falls back to repeating K/V on some."""
    if n_rep == 1:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    b, h, t, d = q.shape
    folded = q.reshape(b, h // n_rep, n_rep * t, d)
    if t > 1:
        mb, _, _, span = mask.shape
        mask = mask[:, :, None].expand(mb, 1, n_rep, t, span).reshape(mb, 1, n_rep * t, span)
    out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask, scale=scale)
    return out.view(b, h, t, d)


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's tensors, looked up once (module attribute access is
    slow Python, and a frame makes hundreds of layer passes)."""

    in_norm: torch.Tensor
    in_eps: float
    q: torch.Tensor
    q_bias: torch.Tensor | None
    k: torch.Tensor
    k_bias: torch.Tensor | None
    v: torch.Tensor
    v_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    qk_eps: float
    post_norm: torch.Tensor
    post_eps: float
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    act: Callable[[torch.Tensor], torch.Tensor]
    # fused projections (quant.convert_layers with fuse=True), else None
    qkv: Any = None
    qkv_bias: torch.Tensor | None = None
    qkv_split: tuple[int, int, int] | None = None
    gate_up: Any = None

    @staticmethod
    def of(layer: Any) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        return _Layer(
            layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
            attn.q_proj.weight, attn.q_proj.bias, attn.k_proj.weight, attn.k_proj.bias,
            attn.v_proj.weight, attn.v_proj.bias, attn.o_proj.weight, attn.o_proj.bias,
            attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.variance_epsilon,
            layer.post_attention_layernorm.weight,
            layer.post_attention_layernorm.variance_epsilon,
            mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, mlp.act_fn)


class _Stack:
    """Direct calls into one official decoder stack (talker or code predictor)."""

    def __init__(self, layers: Any, norm: Any, config: Any) -> None:
        self.modules = list(layers)
        self.layers = [_Layer.of(layer) for layer in self.modules]
        self.norm_w = norm.weight
        self.norm_eps = norm.variance_epsilon
        attn = self.modules[0].self_attn
        self.head_dim = attn.head_dim
        self.n_rep = attn.num_key_value_groups
        self.scaling = attn.scaling
        self.kv_heads = config.num_key_value_heads
        self.heads = config.num_attention_heads
        # on CUDA the predictor's masked attention folds its grouped query heads too: with
        # a mask and enable_gqa, flash and memory-efficient attention both refuse it and
        # each of a frame's 75 predictor passes falls to the math kernel. On the CPU it
        # keeps the official rounding (the parity tests compare against it there).
        self.fold_full = norm.weight.device.type == "cuda"

    def alloc(self, batch: int, length: int, like: torch.Tensor) -> list[KV]:
        shape = (batch, self.kv_heads, length, self.head_dim)
        return [(like.new_zeros(shape), like.new_zeros(shape)) for _ in self.layers]

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,  # noqa: PLR0913
                cache: list[KV], start: int, mask: torch.Tensor | None, full: bool = False,
                rows: torch.Tensor | None = None, span: int | None = None,
                lora: RowAdapters | None = None) -> torch.Tensor:
        """Run all layers on `h` [B, T, H] written at cache slots start..start+T.

        `mask` None: causal over the filled prefix, no padding (the official
        sdpa path with GQA). Otherwise a bool [B, 1, T, S] mask over the first
        S cache slots (S = start+T, or the whole cache when `full`).
        `rows` (static shapes, CUDA graphs): one new position per row, row b
        written at cache slot rows[b] (a device tensor: each row at its own
        place, no host value involved); attention then covers the first
        `span` slots under `mask` [B, 1, 1, span].
        `lora`: each row's adapter voice adds its low-rank update to every adapted
        projection of this stack (`adapters.RowAdapters`; None: the base alone).
        """
        b, t, _ = h.shape
        cos = cos.unsqueeze(1)
        sin = sin.unsqueeze(1)
        index = None
        if rows is not None:
            index = rows.view(b, 1, 1, 1).expand(b, self.kv_heads, 1, self.head_dim)
        for i, (w, kv) in enumerate(zip(self.layers, cache, strict=True)):
            x = _rms(h, w.in_norm, w.in_eps)
            q, k, v = self._qkv(w, i, x, (cos, sin), lora)
            keys, values = self._cached(kv, k, v, start, index, full, span)
            out = self._attend(q, keys, values, mask, index is not None, full)
            out = out.transpose(1, 2).reshape(b, t, -1)
            o = linear(out, w.o, w.o_bias)
            h = h + (o if lora is None else o + lora.delta(i, O_PROJ, out))
            h = h + self._mlp(w, i, _rms(h, w.post_norm, w.post_eps), lora)
        return _rms(h, self.norm_w, self.norm_eps)

    def _qkv(self, w: _Layer, i: int, x: torch.Tensor, rope: KV, lora: RowAdapters | None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer i's queries, keys and values of the normed input `x` [B, T, H], as
        [B, heads, T, D], the queries and keys normed and rotated."""
        b, t, _ = x.shape
        d = self.head_dim
        if w.qkv is not None and w.qkv_split is not None:
            q, k, v = linear(x, w.qkv, w.qkv_bias).split(w.qkv_split, dim=-1)
        else:
            q, k, v = (linear(x, w.q, w.q_bias), linear(x, w.k, w.k_bias),
                       linear(x, w.v, w.v_bias))
        if lora is not None:
            q = q + lora.delta(i, Q_PROJ, x)
            k = k + lora.delta(i, K_PROJ, x)
            v = v + lora.delta(i, V_PROJ, x)
        q = _rms(q.reshape(b, t, -1, d), w.q_norm, w.qk_eps)
        k = _rms(k.reshape(b, t, -1, d), w.k_norm, w.qk_eps)
        v = v.reshape(b, t, -1, d).transpose(1, 2)
        q = q.transpose(1, 2)
        k = k.transpose(1, 2)
        cos, sin = rope
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        return q, k, v

    @staticmethod
    def _cached(kv: KV, k: torch.Tensor, v: torch.Tensor, start: int,
                index: torch.Tensor | None, full: bool, span: int | None) -> KV:
        """The new keys and values written into the layer's cache; the cached keys and
        values attention reads (see `forward` for the slots)."""
        k_cache, v_cache = kv
        if index is not None:
            k_cache.scatter_(2, index, k)
            v_cache.scatter_(2, index, v)
            end = k_cache.shape[2] if span is None else span
        else:
            end = start + k.shape[2]
            k_cache[:, :, start:end] = k
            v_cache[:, :, start:end] = v
            end = k_cache.shape[2] if full else end
        return k_cache[:, :, :end], v_cache[:, :, :end]

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor | None, by_rows: bool, full: bool) -> torch.Tensor:
        """Attention as each caller needs it, each kernel keeping its reference's rounding."""
        if mask is None:
            return F.scaled_dot_product_attention(q, keys, values, scale=self.scaling,
                                                  is_causal=q.shape[2] > 1,
                                                  enable_gqa=self.n_rep > 1)
        if by_rows:
            # the talker's long cache: grouped heads read the shared K/V, never a copy
            return _grouped_attention(q, keys, values, mask, self.scaling, self.n_rep)
        if full and self.fold_full:
            return _grouped_attention(q, keys, values, mask, self.scaling, self.n_rep)
        if full:
            # the predictor's 16-slot cache on the CPU (folding its queries would change
            # rounding against the eager loop, and a K/V copy here is tiny)
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                                  scale=self.scaling, enable_gqa=self.n_rep > 1)
        # padded batch: the official sdpa path repeats K/V here (same rounding)
        return F.scaled_dot_product_attention(
            q, _repeat_kv(keys, self.n_rep), _repeat_kv(values, self.n_rep),
            attn_mask=mask, scale=self.scaling)

    @staticmethod
    def _mlp(w: _Layer, i: int, x: torch.Tensor, lora: RowAdapters | None) -> torch.Tensor:
        """Layer i's feed-forward output for its normed input `x` (added to the stream)."""
        if w.gate_up is not None:
            gate, up = linear(x, w.gate_up).chunk(2, dim=-1)
        else:
            gate, up = linear(x, w.gate), linear(x, w.up)
        if lora is not None:
            gate = gate + lora.delta(i, GATE_PROJ, x)
            up = up + lora.delta(i, UP_PROJ, x)
        mixed = w.act(gate) * up
        down = linear(mixed, w.down)
        return down if lora is None else down + lora.delta(i, DOWN_PROJ, mixed)


def graphs_enabled() -> bool:
    # escape hatch for drivers where capture misbehaves
    return os.environ.get("VOXSHARD_CUDA_GRAPHS", "1") not in ("0", "false", "no")


def _rope_table(rotary: Any, length: int, like: torch.Tensor, axes: int) -> KV:
    """cos/sin [length, head_dim] from the official rotary module.

    For speech the talker's three MRoPE axes carry equal positions, so the
    interleaved table equals axis 0's table bit for bit.
    """
    positions = torch.arange(length, device=like.device)[None]
    if axes == 3:
        cos, sin = rotary(like, positions[None].expand(3, 1, -1))
        return cos[0, 0], sin[0, 0]
    cos, sin = rotary(like, positions)
    return cos[0], sin[0]


@dataclass
class _Padding:
    """A left-padded batch's positions and masks over the prefill (and, in `key_valid`, the
    whole cache, filled frame by frame on the eager path)."""

    pads: torch.Tensor  # [B] pad slots before each row's first token
    pad_slot: torch.Tensor  # [B, t0] True at a pad slot
    positions: torch.Tensor  # [B, t0] rotary position per slot
    key_valid: torch.Tensor | None  # [B, total] slots a query may read; None: no row padded
    mask: torch.Tensor | None  # [B, 1, t0, t0] the prefill's mask; None: no row padded

    @staticmethod
    def of(lengths: list[int], t0: int, total: int, device: torch.device) -> _Padding:
        pads = torch.tensor([t0 - n for n in lengths], device=device)
        # Rotary positions per row: real tokens count from 0 after the left padding
        # (the official code parks pad slots at position 1).
        slots = torch.arange(t0, device=device)
        pad_slot = slots[None] < pads[:, None]
        positions = (slots[None] - pads[:, None]).clamp_min(0)
        positions = torch.where(pad_slot, torch.ones_like(positions), positions)
        if not bool((pads > 0).any()):
            return _Padding(pads, pad_slot, positions, None, None)
        key_valid = torch.zeros(len(lengths), total, dtype=torch.bool, device=device)
        key_valid[:, :t0] = ~pad_slot
        causal = torch.ones(t0, t0, dtype=torch.bool, device=device).tril()
        mask = causal[None] & key_valid[:, None, :t0]
        # a pad query with nothing to attend would give NaN that then leaks
        # through the values; let it see itself (its output is never used)
        mask |= torch.eye(t0, dtype=torch.bool, device=device)[None]
        return _Padding(pads, pad_slot, positions, key_valid, mask[:, None])


@dataclass
class _EagerRows:
    """What the eager frame loop carries from the prefill: its settings, the caches and
    rotary tables, the padding, the rows' voices and sampling noise, the text still to
    feed, and the codes each row has seen (for the repetition penalty)."""

    settings: DecodeSettings
    t0: int
    pad: _Padding
    rope: tuple[torch.Tensor, torch.Tensor]
    t_cache: list[KV]
    p_cache: list[KV]
    lora: RowAdapters | None
    p_lora: Any
    keys: Any
    frame_noise: FrameNoise | None
    trailing: torch.Tensor
    tts_pad: torch.Tensor
    seen: torch.Tensor


class FastTalker:
    """Batched codec-frame generation for one loaded official model.

    `quantize="int8"` / `fuse=True` (CPU options, see quant.py) change how the
    projections run, never the model; the default is the exact official math.
    """

    def __init__(self, model: Any, quantize: str | None = None, fuse: bool = False) -> None:
        self.model = model
        talker = model.talker
        self.talker = talker
        self.cfg = talker.config
        for name, cfg in (("talker", talker.config),
                          ("code predictor", talker.code_predictor.config)):
            rope = getattr(cfg, "rope_scaling", None) or {}
            kind = rope.get("rope_type", rope.get("type", "default"))
            # the loop precomputes rotary tables and attends over the whole
            # cache: both assume what every released 12 Hz model uses
            if kind != "default" or getattr(cfg, "sliding_window", None):
                raise ModelError(f"This model's {name} uses {kind} rotary positions or a "
                                 "sliding window, which Voxshard's decoder does not support.",
                                 "Use a released Qwen3-TTS-12Hz model or one trained from it.")
        self.predictor = talker.code_predictor
        self.t_stack = _Stack(talker.model.layers, talker.model.norm, talker.config)
        self.p_stack = _Stack(self.predictor.model.layers, self.predictor.model.norm,
                              self.predictor.config)
        w = talker.codec_head.weight
        #: the adapter voices speaking on this model, per row (`adapters`)
        self.adapters = Adapters(talker.model.layers, w.device, w.dtype,
                                 self.predictor.model.layers)
        self.groups = self.cfg.num_code_groups
        self.eos = self.cfg.codec_eos_token_id
        self.vocab = self.cfg.vocab_size
        self.p_vocab = self.predictor.config.vocab_size
        w = talker.codec_head.weight
        self.device = w.device
        self.dtype = w.dtype
        self.quantize = quantize
        self.fuse = fuse
        self.head: Any = w
        self.p_heads: list[Any] = [h.weight for h in self.predictor.lm_head]
        if quantize or fuse:
            check_mode(quantize, self.device)
            for stack in (self.t_stack, self.p_stack):
                stack.layers = convert_layers(stack.layers, quantize, fuse)
            if quantize is not None:
                self.head = PACKED[quantize](w)
                self.p_heads = [PACKED[quantize](h) for h in self.p_heads]
        # ids 2048..3071 are control codes; only end-of-speech may be generated
        suppress = torch.zeros(self.vocab, dtype=torch.bool, device=self.device)
        suppress[self.vocab - 1024:] = True
        suppress[self.eos] = False
        self.suppress = suppress
        self.p_cos, self.p_sin = _rope_table(self.predictor.model.rotary_emb, PREDICTOR_POSITIONS,
                                             w, axes=1)
        self._t_rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self._row_batches: dict[tuple[Any, ...], Any] = {}
        #: "captured", "partial", "failed" (logged) or "off": the graphs of the batch
        #: shape the last static call ran (rows.RowBatch.graph_status)
        self.graph_status = "off"
        #: one CUDA graph memory pool for every captured frame of this model
        self.graph_pool: Any = None

    @torch.inference_mode()
    def prepare(self, settings: DecodeSettings, text_chars: int = 220) -> Any:
        """Capture the frame graphs of the common request shape now (at load): one
        row, a chunk of up to `text_chars` characters. A no-op off CUDA or with
        VOXSHARD_CUDA_GRAPHS=0. Returns the prepared `RowBatch` (or None)."""
        if self.device.type != "cuda" or not graphs_enabled():
            return None

        width = max(noise_width(settings.talker, self.vocab),
                    noise_width(settings.predictor, self.p_vocab), 1)
        limit = max_frames_for("x" * text_chars)
        rows = self.row_batch(1, 128 + limit + 1, 128, limit, settings, width)
        rows.prepare(True)
        self.graph_status = rows.graph_status
        return rows

    # -- pieces ------------------------------------------------------------------------
    def _talker_rope(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._t_rope is None or self._t_rope[0].shape[0] < length:
            # grow in large steps so long requests do not recompute it often
            size = max(length, 4096)
            self._t_rope = _rope_table(self.talker.model.rotary_emb, size,
                                       self.talker.codec_head.weight, axes=3)
        return self._t_rope

    def _talker_logits(self, hidden: torch.Tensor, seen: torch.Tensor, generated: int,
                       settings: DecodeSettings) -> torch.Tensor:
        """Processed float32 scores [B, V] for the last position of `hidden`."""
        scores = linear(hidden, self.head)[:, -1].to(torch.float32)
        p = settings.repetition_penalty
        if p != 1.0:
            penalised = torch.where(scores < 0, scores * p, scores / p)
            scores = torch.where(seen, penalised, scores)
        if generated < settings.min_new_tokens or not settings.stop_at_eos:
            scores[:, self.eos] = float("-inf")
        return scores.masked_fill(self.suppress, float("-inf"))

    def predict_codebooks(self, past_hidden: torch.Tensor, token: torch.Tensor,
                          cache: list[KV], pick: Callable[[int, torch.Tensor], torch.Tensor],
                          masks: Sequence[torch.Tensor] | None = None,
                          lora: RowAdapters | None = None,
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """The code predictor's pass over codebooks 1..15 of one frame, after codebook 0
        (`token` [B]): (codes [B, 16], summed input embedding of the frame [B, 1, H]).

        `pick(j, logits)` turns codebook j+1's float32 logits [B, V] into its codes [B]:
        sampled or greedy (decoding), or the reference's own codes (teacher forcing,
        `agreement`). `masks` (the fixed-shape frame, `rows`): step j attends under
        `masks[j]` over the whole cache; without, causally over the filled prefix.
        `lora`: each row's code predictor adapters (`RowAdapters.predictor()`; None: none).
        Capture-safe: a fixed number of steps of fixed shapes, nothing read on the host
        (what `pick` does is the caller's)."""
        pred = self.predictor
        embed0 = self.talker.model.codec_embedding(token[:, None])  # [B, 1, H]
        proj = pred.small_to_mtp_projection
        h = proj(torch.cat((past_hidden, embed0), dim=1))
        codes = [token]
        embeds = [embed0]
        start = 0
        for step in range(self.groups - 1):
            t = h.shape[1]
            cos, sin = self.p_cos[start:start + t][None], self.p_sin[start:start + t][None]
            if masks is None:
                out = self.p_stack.forward(h, cos, sin, cache, start, None, lora=lora)
            else:
                out = self.p_stack.forward(h, cos, sin, cache, start, masks[step], full=True,
                                           lora=lora)
            code = pick(step, linear(out, self.p_heads[step])[:, -1].to(torch.float32))
            codes.append(code)
            emb = pred.model.codec_embedding[step](code[:, None])
            embeds.append(emb)
            start += t
            if step < self.groups - 2:
                h = proj(emb)
        summed = torch.cat(embeds, dim=1).sum(1, keepdim=True)
        return torch.stack(codes, dim=1), summed

    # -- main loop ---------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, prefill: Prefill, max_frames: list[int], settings: DecodeSettings,  # noqa: PLR0913
                 seeds: list[int] | None = None,
                 on_frame: Callable[[int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None,
                 static: bool | None = None, graphs: bool | None = None,
                 on_codes: Callable[[int, torch.Tensor], None] | None = None,
                 adapters: list[int] | None = None,
                 ) -> list[torch.Tensor]:
        """Generate codec frames; returns one [frames, 16] long tensor per row.

        A row ends at end-of-speech (not included) or after its `max_frames`.
        `on_frame(n)` is called after frame n; `should_stop()` returning True
        ends the loop early (cancel), returning what exists so far.
        `on_codes(f, codes)` (streaming) sees frame f's codes [B, 16] as soon as
        they exist; a row has ended at its first end-of-speech code 0 or its cap.
        `static` (default: on CUDA) runs every frame with fixed shapes and all
        state on the device; `graphs` (default: on CUDA) then captures one
        frame as a CUDA graph and replays it.
        `adapters`: each row's adapter voice slot (`self.adapters`; None: slot 0, none).
        """
        cuda = self.device.type == "cuda"
        static = cuda if static is None else static
        if graphs is None:
            graphs = graphs_enabled()
        graphs = graphs and static and cuda
        embeds = prefill.embeds.to(self.device, self.dtype)
        batch, t0, _ = embeds.shape
        width, keys, frame_noise = self._row_noise(settings, batch, max_frames, seeds)
        limit = max(max_frames)
        total = t0 + limit + 1
        cos_t, sin_t = self._talker_rope(total)
        rows = None
        if static:
            # buffers (and captured graphs) are reused by every call of this shape
            rows = self.row_batch(batch, total, prefill.trailing.shape[1], limit, settings,
                                  width)
            t_cache = rows.t_cache
            if keys is not None:
                frame_noise = rows.frame_noise  # the same values; its table made once
        else:
            t_cache = self.t_stack.alloc(batch, total, embeds)
        pad = _Padding.of(prefill.lengths, t0, total, self.device)
        slots_of = torch.tensor(adapters or [0] * batch, dtype=torch.long, device=self.device)
        lora = self.adapters.rows(slots_of) if adapters and any(adapters) else None
        hidden = self.t_stack.forward(embeds, cos_t[pad.positions], sin_t[pad.positions],
                                      t_cache, 0, pad.mask, lora=lora)
        st = _EagerRows(
            settings, t0, pad, (cos_t, sin_t), t_cache,
            self.p_stack.alloc(batch, PREDICTOR_POSITIONS, embeds), lora,
            None if lora is None else lora.predictor(), keys, frame_noise,
            prefill.trailing.to(self.device, self.dtype),
            prefill.tts_pad.to(self.device, self.dtype),
            torch.zeros(batch, self.vocab, dtype=torch.bool, device=self.device))
        # frame f's noise: codebook 0 of frame f (chosen after the talker step that
        # ends frame f-1, or after the prefill), then codebooks 1..15 of frame f
        noise = None if frame_noise is None else frame_noise.draw(keys, 0)
        scores = self._talker_logits(hidden, st.seen, 0, settings)
        token = choose(scores, settings.talker, None if noise is None else noise[:, 0])
        if rows is not None:
            rows.load_rows(slice(None), token, hidden[:, -1:], ~pad.pad_slot, pad.pads,
                           st.trailing, st.tts_pad, settings, keys, slots_of)
            return self._loop_static(rows, t0, max_frames, settings, graphs, on_frame,
                                     should_stop, on_codes)
        return self._loop_eager(st, (token, hidden[:, -1:], noise), max_frames,
                                (on_frame, should_stop, on_codes))

    def _row_noise(self, settings: DecodeSettings, batch: int, max_frames: list[int],
                   seeds: list[int] | None) -> tuple[int, Any, FrameNoise | None]:
        """The rows' limits and seeds checked; the noise width, the rows' keys and the
        frame noise (None, None when nothing samples)."""
        if len(max_frames) != batch or min(max_frames) < 1:
            raise ValueError("one max_frames >= 1 per row is required")
        sampling = settings.talker.do_sample or settings.predictor.do_sample
        if sampling and (seeds is None or len(seeds) != batch):
            raise ValueError("sampling needs one seed per row")
        width = max(noise_width(settings.talker, self.vocab),
                    noise_width(settings.predictor, self.p_vocab), 1)
        keys = row_keys(seeds, self.device) if sampling and seeds is not None else None
        frame_noise = FrameNoise(self.groups, width, self.device) if keys is not None else None
        return width, keys, frame_noise

    def _loop_eager(self, st: _EagerRows, first: tuple[torch.Tensor, torch.Tensor, Any],
                    max_frames: list[int], calls: tuple[Callable[[int], None] | None,
                                                        Callable[[], bool] | None,
                                                        Callable[[int, torch.Tensor], None]
                                                        | None]) -> list[torch.Tensor]:
        """The frame loop with growing shapes (the CPU's): `first` is the prefill's
        (token, last hidden state, noise); `calls` (on_frame, should_stop, on_codes)."""
        on_frame, should_stop, on_codes = calls
        token, past_hidden, noise = first
        settings, seen = st.settings, st.seen
        batch, limit = len(max_frames), max(max_frames)
        limits = torch.tensor(max_frames, device=self.device)
        codes = torch.zeros(batch, limit, self.groups, dtype=torch.long, device=self.device)
        ended = torch.full((batch,), limit, dtype=torch.long, device=self.device)
        done = torch.zeros(batch, dtype=torch.bool, device=self.device)
        frames = 0
        watch = RunawayWatch.of(settings.guard, batch)
        for frame in range(limit):
            is_eos = token == self.eos
            ended = torch.where(is_eos & ~done, torch.full_like(ended, frame), ended)
            done = done | is_eos | (limits <= frame)
            if frame % settings.sync_every == 0 and watch is not None:
                # at the end-of-speech check's sync: a runaway row is done too
                done = done | self._watched(watch, codes, frame)
            if frame % settings.sync_every == 0 and bool(done.all()):
                break
            if should_stop is not None and should_stop():
                break
            seen[torch.arange(batch, device=self.device), token] = True
            frame_codes, summed = self.predict_codebooks(
                past_hidden, token, st.p_cache,
                lambda j, logits, noise=noise: choose(
                    logits, settings.predictor, None if noise is None else noise[:, 1 + j]),
                lora=st.p_lora)
            codes[:, frame] = frame_codes
            frames = frame + 1
            if on_codes is not None:
                on_codes(frame, frame_codes)
            if on_frame is not None:
                on_frame(frames)
            if frames >= limit:
                break
            past_hidden = self._eager_talker_step(st, frame, summed)
            if st.frame_noise is not None:
                noise = st.frame_noise.draw(st.keys, frames)
            scores = self._talker_logits(past_hidden, seen, frames, settings)
            token = choose(scores, settings.talker, None if noise is None else noise[:, 0])
        # rows still running at the end stop at their own cap
        is_eos = token == self.eos
        ended = torch.where(is_eos & ~done, torch.full_like(ended, frames), ended)
        made = torch.tensor(frames, device=self.device)
        lengths = torch.minimum(torch.minimum(ended, limits), made).tolist()
        if watch is not None:
            self._watched(watch, codes, frames)
            lengths = [watch.length(b, n)[0] for b, n in enumerate(lengths)]
        return [codes[b, :n] for b, n in enumerate(lengths)]

    def _eager_talker_step(self, st: _EagerRows, frame: int, summed: torch.Tensor
                           ) -> torch.Tensor:
        """The talker's step after frame `frame`: its codebooks' embeddings plus the next
        text position in, the hidden state out (written at the frame's cache slot)."""
        text = st.trailing[:, frame:frame + 1] if frame < st.trailing.shape[1] else st.tts_pad
        slot = st.t0 + frame
        pos = (slot - st.pad.pads)[:, None]
        step_mask = None
        if st.pad.key_valid is not None:
            st.pad.key_valid[:, slot] = True
            step_mask = st.pad.key_valid[:, None, None, :slot + 1]
        cos_t, sin_t = st.rope
        return self.t_stack.forward(summed + text, cos_t[pos], sin_t[pos], st.t_cache, slot,
                                    step_mask, lora=st.lora)

    def _watched(self, watch: RunawayWatch, codes: torch.Tensor, made: int) -> torch.Tensor:
        """Feed the guard frames up to `made` (codes [B, frames, 16]); the rows it has cut."""
        watch.feed(codes[:, :made, 0].cpu().numpy(), made)
        return torch.tensor([c is not None for c in watch.cut], device=self.device)

    # -- static shapes (CUDA graphs) -----------------------------------------------------
    def row_batch(self, batch: int, total: int, trail: int, limit: int,
                  settings: DecodeSettings, width: int) -> Any:
        """The cached `RowBatch` for this batch shape (sizes rounded up, so nearby
        requests share buffers and graphs); the least recently used one is dropped."""
        # fixed maximum-length buckets: most requests share one shape (and its graphs)
        capacity = bucket(total, 1024)
        trail = bucket(trail, 256)
        limit = bucket(limit, 512)
        key = (batch, capacity, trail, limit, width, settings_key(settings))
        for have in self._row_batches:
            # a bigger batch of the same kind (one prepared at load) serves this one too
            if (have[0] == batch and have[4:] == key[4:] and have[1] >= capacity
                    and have[2] >= trail and have[3] >= limit):
                key = have
                break
        found = self._row_batches.pop(key, None)
        if found is None:
            while len(self._row_batches) >= 2:
                self._row_batches.pop(next(iter(self._row_batches)))
            found = RowBatch(self, batch, capacity, trail, limit, settings, width)
        self._row_batches[key] = found
        return found

    def _loop_static(self, rows: Any, t0: int, max_frames: list[int],
                     settings: DecodeSettings, graphs: bool,
                     on_frame: Callable[[int], None] | None,
                     should_stop: Callable[[], bool] | None,
                     on_codes: Callable[[int, torch.Tensor], None] | None = None,
                     ) -> list[torch.Tensor]:
        """The frame loop with every shape fixed and all state in device buffers
        (`rows.RowBatch`): the host launches one graph per frame instead of
        thousands of kernels, and syncs only every `sync_every` frames."""
        limit = max(max_frames)
        frames = 0
        limits = torch.tensor(max_frames)
        watch = RunawayWatch.of(settings.guard, len(max_frames))
        for f in range(limit):
            if should_stop is not None and should_stop():
                break
            if f and f % settings.sync_every == 0 and self._static_done(rows.codes, f, limits,
                                                                         watch):
                break
            rows.run(rows.span_for(t0 + f), graphs)
            frames = f + 1
            if on_codes is not None:
                on_codes(f, rows.codes[:, f])
            if on_frame is not None:
                on_frame(frames)
        self.graph_status = rows.graph_status if graphs else "off"
        return [c.clone() for c in self._static_lengths(rows.codes, frames, limits, watch)]

    def _static_done(self, codes_all: torch.Tensor, made: int, limits: torch.Tensor,
                     watch: RunawayWatch | None = None) -> bool:
        first = codes_all[:, :made, 0].cpu()
        ended = (first == self.eos).any(dim=1) | (limits <= made)
        if watch is not None:  # the same copy: the guard adds no sync
            watch.feed(first.numpy(), made)
            ended = ended | torch.tensor([c is not None for c in watch.cut])
        return bool(ended.all())

    def _static_lengths(self, codes_all: torch.Tensor, frames: int, limits: torch.Tensor,
                        watch: RunawayWatch | None = None) -> list[torch.Tensor]:
        first = codes_all[:, :frames, 0].cpu()
        if watch is not None:
            watch.feed(first.numpy(), frames)
        out = []
        for b in range(codes_all.shape[0]):
            hits = (first[b] == self.eos).nonzero()
            n = int(hits[0]) if len(hits) else frames
            n = min(n, int(limits[b]), frames)
            if watch is not None:
                n = watch.length(b, n)[0]
            out.append(codes_all[b, :n])
        return out
