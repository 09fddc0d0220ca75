"""A tiny, randomly initialised Whisper built offline, for tests and benchmarks.

It proves loading and decoding through both Whisper backends (transformers,
and faster-whisper after CTranslate2 conversion), not accuracy: its words are
random. The real special tokens are there (start of transcript, language and
task tokens, no-timestamps, 1501 timestamp tokens), the vocabulary is the 256
byte-level tokens padded to a multilingual Whisper's size, and the audio front
end is Whisper's (80 mel bins, 30 s windows), so every code path of a real
Whisper runs.

    make_tiny_whisper(folder)              # transformers folder (config.json, ...)
    convert_to_ctranslate2(folder, out)    # CTranslate2 folder (model.bin, ...)
"""

from __future__ import annotations

from pathlib import Path

import ctranslate2
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    GenerationConfig,
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperTokenizerFast,
)

#: Whisper's language tokens, in its order (the first 99 of the multilingual models, then
#: Cantonese as in large-v3): tools find languages by these names and positions
LANGUAGES = tuple("en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs "
                  "ro da hu ta no th ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk "
                  "br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so af oc ka be tg sd gu "
                  "am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su "
                  "yue".split())
#: vocabulary size of the multilingual Whisper models
MULTILINGUAL_VOCAB = 51865
SPECIALS_BEFORE_TIMESTAMPS = ("<|endoftext|>", "<|startoftranscript|>",
                              *(f"<|{code}|>" for code in LANGUAGES),
                              "<|translate|>", "<|transcribe|>", "<|startoflm|>",
                              "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def _tokenizer(folder: Path) -> dict[str, int]:
    """Byte-level BPE (no merges) plus Whisper's special tokens; saves tokenizer files."""
    vocab = {ch: i for i, ch in enumerate(_bytes_to_unicode().values())}
    specials_count = len(SPECIALS_BEFORE_TIMESTAMPS) + 1501
    # unused filler tokens bring the vocabulary to a real multilingual Whisper's size,
    # which is how CTranslate2 tells a multilingual model (language detection) apart
    for k in range(MULTILINGUAL_VOCAB - specials_count - len(vocab)):
        vocab[f"<unused_{k}>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [*SPECIALS_BEFORE_TIMESTAMPS,
                *(f"<|{i * 0.02:.2f}|>" for i in range(1501))]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    raw = folder / "tokenizer.json"
    tok.save(str(raw))
    fast = WhisperTokenizerFast(tokenizer_file=str(raw), unk_token="<|endoftext|>",
                                bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                pad_token="<|endoftext|>")
    fast.save_pretrained(str(folder))
    return {s: tok.token_to_id(s) for s in specials}


def make_tiny_whisper(folder: str | Path, seed: int = 0) -> Path:
    """Build and save a tiny random Whisper (about 1.8 M parameters, 7 MB) in `folder`."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    ids = _tokenizer(out)
    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    vocab_size = max(ids.values()) + 1
    cfg = WhisperConfig(
        vocab_size=vocab_size, num_mel_bins=80, d_model=32, encoder_layers=1,
        decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=1500,
        max_target_positions=448, pad_token_id=eot, bos_token_id=eot, eos_token_id=eot,
        decoder_start_token_id=sot, suppress_tokens=[], begin_suppress_tokens=[eot],
    )
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        # the output projection is tied to the token embeddings: zero rows for the
        # special tokens keep random weights from ending every transcript at once or
        # emitting only markers (so words come out, and the word-timing code runs)
        model.get_input_embeddings().weight[256:].zero_()
    gen = GenerationConfig(
        decoder_start_token_id=sot, eos_token_id=eot, pad_token_id=eot, bos_token_id=eot,
        max_length=24, is_multilingual=True,
        lang_to_id={f"<|{c}|>": ids[f"<|{c}|>"] for c in LANGUAGES},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        no_timestamps_token_id=ids["<|notimestamps|>"], prev_sot_token_id=ids["<|startofprev|>"],
        max_initial_timestamp_index=50, alignment_heads=[[0, 0], [0, 1]],
        suppress_tokens=[], begin_suppress_tokens=[eot],
    )
    model.generation_config = gen
    model.save_pretrained(str(out))
    WhisperFeatureExtractor(feature_size=80).save_pretrained(str(out))
    (out / "VOXSHARD_TINY_WHISPER").write_text("random weights: for tests only\n")
    return out


def convert_to_ctranslate2(folder: str | Path, out_dir: str | Path) -> Path:
    """The CTranslate2 form of a transformers Whisper folder (what faster-whisper loads)."""
    out = Path(out_dir)
    converter = ctranslate2.converters.TransformersConverter(
        str(folder), copy_files=["tokenizer.json", "preprocessor_config.json"])
    converter.convert(str(out), force=True)
    return out
