"""The single-speaker training sequence layout of Qwen3-TTS (12 Hz).

Two channels of ids, summed position by position after embedding, exactly as
the official `generate_custom_voice(..., non_streaming_mode=True)` builds its
input with no explicit language (so no language id that training never saw):

    pos   text channel                  codec channel
    0-2   <|im_start|> assistant \\n      (none)
    3     tts_pad                       nothink
    4     tts_pad                       think_bos
    5     tts_pad                       think_eos
    6     tts_pad                       speaker slot (the x-vector itself)
    7     tts_bos                       pad
    8..   the N text tokens             pad
    N+8   tts_eos                       pad
    N+9   tts_pad                       bos
    N+10+f tts_pad                      codebook-0 code of frame f, plus the
                                        code-predictor embeddings of codebooks 1..15
    N+10+T tts_pad                      eos

So a clip of N text tokens and T frames is N + T + 11 positions long.

A clip with a style description (an instruction, e.g. "whisper") puts the
K tokens of `<|im_start|>user\n{description}<|im_end|>\n` in front of all of
that, on the text channel alone (no codec embedding under them), exactly where
the official custom-voice/voice-design `generate` puts `instruct_ids`; every
position above then moves K places right (the speaker slot to K + 6). The
instruction is prompt: it is never a target, so the loss never covers it.

The talker is trained to predict the codec token at q+1 from position q for every
q+1 that is an audio frame or the final eos (never the prompt: inference feeds
it). The arrays here are plain numpy so data loading never needs torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: codebooks per frame of the 12 Hz codec
NUM_CODEBOOKS = 16
#: `<|im_start|>assistant\n` is three tokens in every Qwen3-TTS tokenizer
ROLE_LEN = 3
#: position of the speaker slot (filled with the speaker-encoder x-vector)
SPEAKER_POS = 6
#: positions that are neither text tokens nor frames: role (3), tags and
#: speaker (4), tts_bos/pad (1), tts_eos (1), bos (1), eos (1)
NUM_SPECIAL_POSITIONS = 11
#: codec-channel id meaning "no codec embedding here" (role tokens, speaker slot, padding)
NO_CODEC = -1
#: sub-code value meaning "not an audio frame"
NO_CODE = -1


@dataclass(frozen=True)
class LayoutIds:
    """Special token ids the layout needs, read from the model's config.json."""

    tts_pad: int
    tts_bos: int
    tts_eos: int
    codec_nothink: int
    codec_think_bos: int
    codec_think_eos: int
    codec_pad: int
    codec_bos: int
    codec_eos: int

    @classmethod
    def from_config(cls, config: Any) -> LayoutIds:
        """From a `Qwen3TTSConfig` object or the parsed config.json dict."""
        if isinstance(config, Mapping):
            top = config
            talker = config["talker_config"]
        else:
            top = config.to_dict() if hasattr(config, "to_dict") else vars(config)
            talker = top["talker_config"]
            if not isinstance(talker, Mapping):
                talker = talker.to_dict()
        return cls(
            tts_pad=int(top["tts_pad_token_id"]),
            tts_bos=int(top["tts_bos_token_id"]),
            tts_eos=int(top["tts_eos_token_id"]),
            codec_nothink=int(talker["codec_nothink_id"]),
            codec_think_bos=int(talker["codec_think_bos_id"]),
            codec_think_eos=int(talker["codec_think_eos_id"]),
            codec_pad=int(talker["codec_pad_id"]),
            codec_bos=int(talker["codec_bos_id"]),
            codec_eos=int(talker["codec_eos_token_id"]),
        )


def assistant_text(text: str) -> str:
    """The chat wrapping the official inference tokenizes (same string, same tokens)."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruct_text(description: str) -> str:
    """The user turn the official inference tokenizes for an instruction."""
    return f"<|im_start|>user\n{description}<|im_end|>\n"


def _ids(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer(text)["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(i) for i in ids]


def tokenize_instruct(tokenizer: Any, description: str) -> list[int]:
    """Instruction token ids, all of them, as the official inference feeds them.

    An empty description is no instruction (the official code skips it too).
    """
    return _ids(tokenizer, instruct_text(description)) if description.strip() else []


def tokenize(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    """(role ids, text ids) exactly as inference slices them.

    Inference tokenizes the whole wrapped string and slices [:3] and [3:-5];
    doing the same (rather than tokenizing the bare text) guarantees the same
    BPE merges at the edges.
    """
    ids = _ids(tokenizer, assistant_text(text))
    if len(ids) < ROLE_LEN + 5 + 1:
        raise ValueError(f"text {text!r} tokenized to nothing")
    return ids[:ROLE_LEN], ids[ROLE_LEN:-5]


@dataclass
class ClipSequence:
    """One clip laid out; every array has length L = K + N + T + 11 (K instruction tokens)."""

    #: (L,) text-channel token ids
    text_ids: np.ndarray
    #: (L,) codec-channel ids (codebook-0 codes at frames), NO_CODEC where none
    codec_ids: np.ndarray
    #: (L, 15) codebooks 1..15 at audio frames, NO_CODE elsewhere
    sub_codes: np.ndarray
    #: (L,) True where the codec token is a talker target (audio frames and the final eos)
    target_mask: np.ndarray
    #: (L,) True at audio frames
    frame_mask: np.ndarray
    #: position of the speaker slot (SPEAKER_POS after the instruction's K tokens)
    speaker_pos: int = SPEAKER_POS

    @property
    def length(self) -> int:
        return int(self.text_ids.shape[0])


def sequence_length(num_text_tokens: int, num_frames: int, num_instruct_tokens: int = 0) -> int:
    return num_instruct_tokens + num_text_tokens + num_frames + NUM_SPECIAL_POSITIONS


def build_sequence(ids: LayoutIds, role_ids: Sequence[int], text_ids: Sequence[int],
                   codes: np.ndarray, instruct_ids: Sequence[int] = ()) -> ClipSequence:
    """Lay out one clip: `codes` is the (T, 16) codec output of its audio.

    instruct_ids: `tokenize_instruct` of the clip's style description (empty: none).
    """
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[1] != NUM_CODEBOOKS:
        raise ValueError(f"codes must be (T, {NUM_CODEBOOKS}), got {codes.shape}")
    if len(role_ids) != ROLE_LEN:
        raise ValueError(f"role ids must be {ROLE_LEN} tokens, got {len(role_ids)}")
    n, t = len(text_ids), codes.shape[0]
    if n < 1 or t < 1:
        raise ValueError("a clip needs at least one text token and one frame")
    length = sequence_length(n, t)
    first_frame = n + 10
    seq = _plain_sequence(ids, role_ids, text_ids, codes, length, first_frame)
    if not len(instruct_ids):
        return seq
    k = len(instruct_ids)
    return ClipSequence(
        np.concatenate((np.asarray(instruct_ids, dtype=np.int64), seq.text_ids)),
        np.concatenate((np.full(k, NO_CODEC, dtype=np.int64), seq.codec_ids)),
        np.concatenate((np.full((k, NUM_CODEBOOKS - 1), NO_CODE, dtype=np.int64), seq.sub_codes)),
        np.concatenate((np.zeros(k, dtype=bool), seq.target_mask)),
        np.concatenate((np.zeros(k, dtype=bool), seq.frame_mask)),
        SPEAKER_POS + k)


def _plain_sequence(ids: LayoutIds, role_ids: Sequence[int], text_ids: Sequence[int],
                    codes: np.ndarray, length: int, first_frame: int) -> ClipSequence:
    n, t = len(text_ids), codes.shape[0]
    text = np.full(length, ids.tts_pad, dtype=np.int64)
    text[:ROLE_LEN] = role_ids
    text[7] = ids.tts_bos
    text[8:8 + n] = text_ids
    text[8 + n] = ids.tts_eos

    codec = np.full(length, ids.codec_pad, dtype=np.int64)
    codec[:ROLE_LEN] = NO_CODEC
    codec[3:6] = (ids.codec_nothink, ids.codec_think_bos, ids.codec_think_eos)
    codec[SPEAKER_POS] = NO_CODEC  # the x-vector goes here, not a codec row
    codec[first_frame - 1] = ids.codec_bos
    codec[first_frame:first_frame + t] = codes[:, 0]
    codec[first_frame + t] = ids.codec_eos

    sub = np.full((length, NUM_CODEBOOKS - 1), NO_CODE, dtype=np.int64)
    sub[first_frame:first_frame + t] = codes[:, 1:]

    frame_mask = np.zeros(length, dtype=bool)
    frame_mask[first_frame:first_frame + t] = True
    target_mask = frame_mask.copy()
    target_mask[first_frame + t] = True
    return ClipSequence(text, codec, sub, target_mask, frame_mask)


def collate(seqs: Sequence[ClipSequence], ids: LayoutIds) -> dict[str, np.ndarray]:
    """Right-pad a list of sequences into (B, Lmax) arrays.

    Right padding keeps every real position's causal context free of padding,
    so positions 0..L-1 and the losses are the same as for the clip alone.
    """
    if not seqs:
        raise ValueError("cannot collate an empty batch")
    lmax = max(s.length for s in seqs)
    b = len(seqs)
    out = {
        "text_ids": np.full((b, lmax), ids.tts_pad, dtype=np.int64),
        "codec_ids": np.full((b, lmax), NO_CODEC, dtype=np.int64),
        "sub_codes": np.full((b, lmax, NUM_CODEBOOKS - 1), NO_CODE, dtype=np.int64),
        "target_mask": np.zeros((b, lmax), dtype=bool),
        "frame_mask": np.zeros((b, lmax), dtype=bool),
        "attention_mask": np.zeros((b, lmax), dtype=np.int64),
        "speaker_pos": np.array([s.speaker_pos for s in seqs], dtype=np.int64),
    }
    for i, s in enumerate(seqs):
        n = s.length
        out["text_ids"][i, :n] = s.text_ids
        out["codec_ids"][i, :n] = s.codec_ids
        out["sub_codes"][i, :n] = s.sub_codes
        out["target_mask"][i, :n] = s.target_mask
        out["frame_mask"][i, :n] = s.frame_mask
        out["attention_mask"][i, :n] = 1
    return out


def count_tokens(seqs: Sequence[ClipSequence]) -> tuple[int, int]:
    """(talker targets, sub-talker targets) of these sequences.

    The talker predicts every target position but the first one's predecessor
    is always inside the sequence, so talker targets = frames + 1 (eos) per clip;
    the sub-talker predicts 15 codebooks at every frame.
    """
    talker = sum(int(s.target_mask.sum()) for s in seqs)
    sub = sum(int(s.frame_mask.sum()) for s in seqs) * (NUM_CODEBOOKS - 1)
    return talker, sub
