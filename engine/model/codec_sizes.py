"""The 12 Hz codec decoder at its published size, built with random weights.

The installed `qwen_tts` 0.1.1 decoder config defaults are not the published
sizes (and cannot even be built: no `codebook_dim`/`head_dim`); these are
(docs: qwen3-tts-facts.md "The 12 Hz codec decoder at its real size"). The
streaming tests and bench/bench_synth.py decode with this configuration so
their work and timings are those of the real codec, not the tiny one.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.model.official import codec_modules

#: published 12 Hz decoder: 1,920 samples per frame, 114.3M parameters
REAL_DECODER_CONFIG: dict[str, Any] = {
    "codebook_size": 2048,
    "codebook_dim": 512,
    "hidden_size": 512,
    "head_dim": 64,
    "latent_dim": 1024,
    "intermediate_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "sliding_window": 72,
    "num_hidden_layers": 8,
    "num_quantizers": 16,
    "rope_theta": 10000,
    "rms_norm_eps": 1e-5,
    "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "decoder_dim": 1536,
}


def build_decoder(config: dict[str, Any] | None = None, seed: int = 0,
                  peak: float = 0.3) -> Any:
    """The official `Qwen3TTSTokenizerV2Decoder` with random weights (fp32, eval).

    Codebooks are spread out (they start at zero, which maps every code to the
    same vector) and the last convolution is scaled so decoded random codes
    peak near `peak` instead of clipping or vanishing: the output stays in the
    range where comparisons of two decodes mean something.
    """
    cfg_mod, model_mod = codec_modules()
    torch.manual_seed(seed)
    cfg = cfg_mod.Qwen3TTSTokenizerV2DecoderConfig(**(config or REAL_DECODER_CONFIG))
    cfg._attn_implementation = "sdpa"
    decoder = model_mod.Qwen3TTSTokenizerV2Decoder(cfg).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in decoder.named_parameters():
            if name.endswith("embedding_sum"):
                param.copy_(torch.randn(param.shape, generator=gen))
        codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, 6), generator=gen)
        top = float(decoder(codes).abs().max())
        last = decoder.decoder[-1].conv
        scale = peak / max(top, 1e-12)
        last.weight.mul_(scale)
        if last.bias is not None:
            last.bias.mul_(scale)
    return decoder
