"""A tiny, randomly initialised Qwen3-TTS model of the real architecture.

Tests and offline demos use it: every official code path (load, voice clone,
custom voice, codec encode/decode) runs on it without a download. It keeps
what the code depends on: the real codec vocabulary (3072) and special ids,
3-axis interleaved MRoPE, 16 code groups of 2048, a 128-bin mel speaker
encoder, a 12 Hz codec with 1920 samples per frame. Widths are tiny.
Deterministic for a given seed.
"""

from __future__ import annotations

import importlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import EncodecFeatureExtractor, Qwen2TokenizerFast

from engine.audio.timebase import SAMPLE_RATE
from engine.core.errors import InputError
from engine.model.official import codec_modules, configuration, import_qwen_tts, modeling

# Codec ids of the real models (facts file); the tiny model keeps them.
CODEC_IDS = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}
TEXT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                 "<|tts_pad|>", "<|tts_text_bos|>", "<|tts_text_eod|>"]
# Role words must be single tokens: the official code slices `<|im_start|>assistant\n`
# as exactly three tokens.
ROLE_WORDS = ["assistant", "user", "system"]
TEXT_VOCAB = 1024
TALKER_HIDDEN = 64

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A voice is a sound shaped by breath. "
    "She sells sea shells by the sea shore; the shells she sells are surely sea shells. "
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood? "
    "Numbers like 1, 2, 3, 10, 42 and 2026 appear in text, as do dates and times. "
    "Peter Piper picked a peck of pickled peppers. Every good boy deserves fruit. "
    "Hello, world! Is this thing on? Yes: it is, and it works well enough for tests. "
)


def _text_tokenizer(out: Path) -> dict[str, int]:
    """Train a small byte-level BPE, save it as a Qwen2 fast tokenizer, return special ids."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TEXT_VOCAB - len(TEXT_SPECIALS) - len(ROLE_WORDS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = Qwen2TokenizerFast(tokenizer_object=tok, unk_token=None, bos_token=None,
                              eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.add_tokens(ROLE_WORDS)
    fast.add_special_tokens({"additional_special_tokens": TEXT_SPECIALS[1:]})
    processor_cls = modeling().Qwen3TTSProcessor if hasattr(modeling(), "Qwen3TTSProcessor") \
        else _processor_class()
    processor_cls(tokenizer=fast).save_pretrained(str(out))
    ids = {t: fast.convert_tokens_to_ids(t) for t in TEXT_SPECIALS + ROLE_WORDS}
    if max(ids.values()) >= TEXT_VOCAB:
        raise RuntimeError(f"tiny tokenizer produced ids beyond {TEXT_VOCAB}: {ids}")
    return ids


def _processor_class() -> Any:
    import_qwen_tts()
    return importlib.import_module("qwen_tts.core.models.processing_qwen3_tts").Qwen3TTSProcessor


def tiny_config_dict(text_ids: dict[str, int]) -> dict[str, Any]:
    head_dim = 16
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": "tiny",
        "tts_model_type": "base",
        "im_start_token_id": text_ids["<|im_start|>"],
        "im_end_token_id": text_ids["<|im_end|>"],
        "tts_pad_token_id": text_ids["<|tts_pad|>"],
        "tts_bos_token_id": text_ids["<|tts_text_bos|>"],
        "tts_eos_token_id": text_ids["<|tts_text_eod|>"],
        "assistant_token_id": text_ids["assistant"],
        "talker_config": {
            "vocab_size": 3072,
            "hidden_size": TALKER_HIDDEN,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000,
            # three axes carry equal positions for speech, sections sum to head_dim/2
            "rope_scaling": {"interleaved": True, "mrope_section": [4, 2, 2],
                             "rope_type": "default"},
            "num_code_groups": 16,
            "text_vocab_size": TEXT_VOCAB,
            "text_hidden_size": 32,
            "position_id_per_seconds": 13,
            "spk_id": {},
            "spk_is_dialect": {},
            "codec_language_id": {},
            **CODEC_IDS,
            "code_predictor_config": {
                "vocab_size": 2048,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "head_dim": 16,
                "max_position_embeddings": 64,
                "rope_theta": 1000000,
                "num_code_groups": 16,
            },
        },
        "speaker_encoder_config": {
            "mel_dim": 128,  # fixed by the official mel front end
            "enc_dim": TALKER_HIDDEN,
            "enc_channels": [32, 32, 32, 32, 96],
            "enc_kernel_sizes": [5, 3, 3, 3, 1],
            "enc_dilations": [1, 2, 3, 4, 1],
            "enc_attention_channels": 16,
            "enc_res2net_scale": 4,
            "enc_se_channels": 16,
            "sample_rate": SAMPLE_RATE,
        },
    }


def tiny_codec_config_dict() -> dict[str, Any]:
    return {
        "model_type": "qwen3_tts_tokenizer_12hz",
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": SAMPLE_RATE,
        "output_sample_rate": SAMPLE_RATE,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
        # Mimi encoder: 8*6*5*4 = 960 samples -> 25 Hz, then a stride-2 downsample -> 12.5 Hz
        "encoder_config": {
            "sampling_rate": SAMPLE_RATE,
            "frame_rate": 12.5,
            "audio_channels": 1,
            "hidden_size": 32,
            "num_filters": 2,
            "upsampling_ratios": [8, 6, 5, 4],
            "num_residual_layers": 1,
            "codebook_size": 2048,
            "codebook_dim": 16,
            "vector_quantization_hidden_dimension": 16,
            "num_quantizers": 16,
            "num_semantic_quantizers": 1,
            "upsample_groups": 32,
            "num_hidden_layers": 1,
            "intermediate_size": 64,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "sliding_window": 250,
            "max_position_embeddings": 8000,
        },
        # decoder: 8*5*4*3 * 2*2 = 1920 samples per code frame
        "decoder_config": {
            "codebook_size": 2048,
            "codebook_dim": 32,
            "hidden_size": 32,
            "latent_dim": 32,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_quantizers": 16,
            "upsample_rates": [8, 5, 4, 3],
            "upsampling_ratios": [2, 2],
            "decoder_dim": 32,
            "sliding_window": 72,
            "max_position_embeddings": 8000,
        },
    }


GENERATE_CONFIG = {
    "do_sample": True,
    "top_k": 50,
    "top_p": 1.0,
    "temperature": 0.9,
    "repetition_penalty": 1.05,
    "subtalker_dosample": True,
    "subtalker_top_k": 50,
    "subtalker_top_p": 1.0,
    "subtalker_temperature": 0.9,
    "max_new_tokens": 2048,
}


def _randomise_codebooks(model: Any, generator: Any) -> None:
    """Codebooks start at zero, which maps every frame to code 0: spread them out."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("embedding_sum") or name.endswith("embed_sum"):
                param.copy_(torch.randn(param.shape, generator=generator))
        for name, buf in model.named_buffers():
            if name.endswith("embed_sum") or name.endswith("embedding_sum"):
                buf.copy_(torch.randn(buf.shape, generator=generator))
            elif name.endswith("initialized"):
                buf.fill_(1)


def _make_audible(codec: Any, generator: Any) -> None:
    """Random decoder weights give a waveform around 1e-8; scale the last
    convolution so decoded noise peaks near 0.3, like speech would."""
    codes = torch.randint(0, 2048, (1, 25, 16), generator=generator)
    with torch.no_grad():
        peak = float(codec.decode(codes).audio_values[0].abs().max())
        last = codec.decoder.decoder[-1].conv
        scale = 0.3 / max(peak, 1e-12)
        last.weight.mul_(scale)
        if last.bias is not None:
            last.bias.mul_(scale)


def _build_codec(out: Path, seed: int) -> None:
    cfg_mod, model_mod = codec_modules()
    torch.manual_seed(seed + 1)
    config = cfg_mod.Qwen3TTSTokenizerV2Config(**tiny_codec_config_dict())
    codec = model_mod.Qwen3TTSTokenizerV2Model(config).eval()
    _randomise_codebooks(codec, torch.Generator().manual_seed(seed + 2))
    _make_audible(codec, torch.Generator().manual_seed(seed + 3))
    codec.save_pretrained(str(out), safe_serialization=True)
    EncodecFeatureExtractor(feature_size=1, sampling_rate=SAMPLE_RATE, padding_value=0.0,
                            return_attention_mask=True).save_pretrained(str(out))


def make_tiny_model(out_dir: str | Path, seed: int = 0, overwrite: bool = False) -> Path:
    """Write a tiny random Qwen3-TTS Base model folder at `out_dir` and return it."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise InputError(f"{out} already exists and is not empty.",
                         "Choose a new folder or pass --overwrite.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        text_ids = _text_tokenizer(tmp)
        config = configuration().Qwen3TTSConfig(**tiny_config_dict(text_ids))
        torch.manual_seed(seed)
        model = modeling().Qwen3TTSForConditionalGeneration(config).eval()
        model.save_pretrained(str(tmp), safe_serialization=True)
        _fix_config(tmp / "config.json")
        (tmp / "generation_config.json").write_text(json.dumps(GENERATE_CONFIG, indent=2))
        _build_codec(tmp / "speech_tokenizer", seed)
        (tmp / "VOXSHARD_TINY_MODEL").write_text(
            f"Tiny random Qwen3-TTS for tests (seed {seed}); it speaks noise.\n")
        tmp.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _fix_config(path: Path) -> None:
    cfg = json.loads(path.read_text())
    # save_pretrained writes "model_type": "" for the speaker encoder, which
    # AutoConfig then rejects on load.
    spk = cfg.get("speaker_encoder_config", {})
    if spk.get("model_type", None) == "":
        del spk["model_type"]
    path.write_text(json.dumps(cfg, indent=2))
