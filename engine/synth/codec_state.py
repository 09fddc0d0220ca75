"""The official 12 Hz codec decoder run piece by piece, each frame decoded once.

The decoder (`Qwen3TTSTokenizerV2Decoder`) is causal throughout, and each of
its parts needs only a bounded amount of the past:
- the quantizer lookup and 1x1 projections: nothing (per frame);
- each causal convolution: its last `(kernel - 1) * dilation` input samples
  (the official code pads that many zeros on the left);
- each transposed convolution: the `kernel - stride` output samples that its
  last inputs spill past the piece's end (the official code cuts them off the
  end of the whole decode; in a stream they belong to the next piece);
- each sliding-window transformer layer: the keys and values of its last
  `sliding_window - 1` positions (a query sees the `sliding_window` keys up to
  and including its own, as the official mask does), and the frame count for
  the rotary positions.

`CodecState` keeps exactly that between calls and runs the official modules'
weights on each new piece, so a stream of pieces gives the samples of one
full decode of all frames (within float rounding: convolutions over a longer
input may sum in another order) while every frame goes through the decoder
once. `frames_decoded` counts them, for the tests and the bench.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.model.official import codec_modules


class CodecState:
    """Incremental decoding of one batch of codec streams ([B, 16, n] codes per call)."""

    def __init__(self, decoder: Any) -> None:
        self.decoder = decoder
        cfg = decoder.config
        self.window = int(cfg.sliding_window)
        self.layers = list(decoder.pre_transformer.layers)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self.position = 0  # frames decoded so far (rotary position of the next one)
        self.frames_decoded = 0
        self.calls = 0
        self._tails: dict[int, torch.Tensor] = {}  # id(module) -> carried samples
        self._kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(self.layers)

        self._rope = codec_modules()[1].apply_rotary_pos_emb

    def copy(self) -> CodecState:
        """A state that continues from this one independently (the reference of
        in-context cloning is decoded once, then every chunk starts from a copy).
        Shallow: the carried tensors are replaced between calls, never written."""
        twin = CodecState.__new__(CodecState)
        twin.__dict__.update(self.__dict__)
        twin._tails = dict(self._tails)
        twin._kv = list(self._kv)
        twin.frames_decoded = 0
        twin.calls = 0
        return twin

    def reset(self) -> None:
        self.position = 0
        self._tails.clear()
        self._kv = [None] * len(self.layers)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Samples [B, n * 1920] of the next n frames `codes` [B, 16, n]."""
        dec = self.decoder
        n = codes.shape[-1]
        if n == 0:
            return torch.zeros(codes.shape[0], 0, device=codes.device)
        if codes.shape[1] != dec.config.num_quantizers:
            raise ValueError(f"expected {dec.config.num_quantizers} codebooks, "
                             f"got {codes.shape[1]}")
        hidden = dec.quantizer.decode(codes)
        hidden = self._conv(dec.pre_conv, hidden).transpose(1, 2)
        hidden = self._transformer(hidden).permute(0, 2, 1)
        for blocks in dec.upsample:
            for block in blocks:
                hidden = self._block(block, hidden)
        for block in dec.decoder:
            hidden = self._block(block, hidden)
        self.position += n
        self.frames_decoded += n * codes.shape[0]
        self.calls += 1
        return hidden.clamp(min=-1, max=1)[:, 0]

    # -- convolutions -------------------------------------------------------------------
    def _block(self, block: Any, x: torch.Tensor) -> torch.Tensor:
        kind = type(block).__name__
        if kind.endswith("CausalConvNet"):
            return self._conv(block, x)
        if kind.endswith("CausalTransConvNet"):
            return self._trans_conv(block, x)
        if kind == "SnakeBeta":
            return block(x)
        if kind.endswith("ConvNeXtBlock"):
            h = self._conv(block.dwconv, x).permute(0, 2, 1)
            h = block.pwconv2(block.act(block.pwconv1(block.norm(h))))
            return x + (block.gamma * h).permute(0, 2, 1)
        if kind.endswith("DecoderResidualUnit"):
            h = self._conv(block.conv1, block.act1(x))
            return self._conv(block.conv2, block.act2(h)) + x
        if kind.endswith("DecoderDecoderBlock"):
            for part in block.block:
                x = self._block(part, x)
            return x
        raise TypeError(f"the streaming codec does not know the decoder part {kind}")

    def _conv(self, mod: Any, x: torch.Tensor) -> torch.Tensor:
        if mod.stride != 1:
            raise TypeError("the streaming codec expects stride-1 causal convolutions")
        keep = mod.kernel_size - 1  # the official left padding
        if keep == 0:
            return mod.conv(x)
        tail = self._tails.get(id(mod))
        if tail is None:
            tail = x.new_zeros(x.shape[0], x.shape[1], keep)
        full = torch.cat((tail, x), dim=-1)
        self._tails[id(mod)] = full[..., -keep:]
        return mod.conv(full)

    def _trans_conv(self, mod: Any, x: torch.Tensor) -> torch.Tensor:
        conv = mod.conv
        stride = conv.stride[0]
        spill = conv.kernel_size[0] - stride
        if spill == 0:
            return conv(x)
        if spill > stride:
            raise TypeError("the streaming codec expects transposed kernels of at most 2 strides")
        y = F.conv_transpose1d(x, conv.weight, None, stride)
        carried = self._tails.get(id(mod))
        if carried is not None:
            y[..., :spill] += carried
        cut = x.shape[-1] * stride
        # the spill holds no bias yet: the next piece's own outputs add it once
        self._tails[id(mod)] = y[..., cut:].clone()
        y = y[..., :cut]
        return y if conv.bias is None else y + conv.bias[:, None]

    # -- sliding-window transformer -----------------------------------------------------
    def _transformer(self, hidden: torch.Tensor) -> torch.Tensor:
        model = self.decoder.pre_transformer
        hidden = model.input_proj(hidden)
        n = hidden.shape[1]
        positions = torch.arange(self.position, self.position + n, device=hidden.device)
        cos, sin = model.rotary_emb(hidden, positions[None])
        for i, layer in enumerate(self.layers):
            residual = hidden
            h = layer.input_layernorm(hidden)
            h = self._attention(i, layer.self_attn, h, cos, sin, positions)
            hidden = residual + layer.self_attn_layer_scale(h)
            residual = hidden
            h = layer.mlp(layer.post_attention_layernorm(hidden))
            hidden = residual + layer.mlp_layer_scale(h)
        return model.output_proj(model.norm(hidden))

    def _attention(self, index: int, attn: Any, h: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, n, _ = h.shape
        d = self.head_dim
        q = attn.q_norm(attn.q_proj(h).view(b, n, -1, d)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(h).view(b, n, -1, d)).transpose(1, 2)
        v = attn.v_proj(h).view(b, n, -1, d).transpose(1, 2)
        q, k = self._rope(q, k, cos, sin)
        past = self._kv[index]
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        span = k.shape[2]
        # later queries see at most window - 1 earlier positions: keep just those
        keep = min(span, self.window - 1)
        self._kv[index] = (k[:, :, span - keep:], v[:, :, span - keep:])
        key_pos = torch.arange(self.position + n - span, self.position + n, device=h.device)
        ahead = positions[:, None] - key_pos[None]
        mask = (ahead >= 0) & (ahead < self.window)
        rep = self.heads // self.kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
        return attn.o_proj(out.transpose(1, 2).reshape(b, n, -1))
