"""The training layout equals what official inference builds, position by position.

Reference: the official `Qwen3TTSForConditionalGeneration.generate` (the code
behind `generate_custom_voice`, non_streaming_mode=True, language auto), run
greedily on the tiny model with an x-vector in the speaker slot. We record
every input embedding it feeds the talker, the hidden states it gets back and
the codes it picks, then lay out the same text + codes for training and check:
the input embeddings are equal, the talker hidden states before every frame
are equal, and teacher-forced argmaxes reproduce the generated codes (which
also pins down the sub-talker's input convention).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.data.layout import (
    NO_CODE,
    NO_CODEC,
    SPEAKER_POS,
    LayoutIds,
    build_sequence,
    collate,
    count_tokens,
    sequence_length,
    tokenize,
)
from engine.train.objective import VoiceObjective, batch_to_device
from tests.helpers.official import load_official, official_generate

# numeric parity: the batched layout's embeddings against a per-position reference.
# packaging/run_tests.sh runs these again under other CPU kernel dispatches.
pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def official(tiny_model_dir: Path) -> Any:
    return load_official(tiny_model_dir)


def test_layout_positions_by_hand() -> None:
    ids = LayoutIds(tts_pad=100, tts_bos=101, tts_eos=102, codec_nothink=2155,
                    codec_think_bos=2156, codec_think_eos=2157, codec_pad=2148,
                    codec_bos=2149, codec_eos=2150)
    codes = np.arange(3 * 16).reshape(3, 16)
    s = build_sequence(ids, [7, 8, 9], [40, 41], codes)
    assert s.length == sequence_length(2, 3) == 16
    assert s.text_ids.tolist() == [7, 8, 9, 100, 100, 100, 100, 101, 40, 41, 102,
                                   100, 100, 100, 100, 100]
    assert s.codec_ids.tolist() == [NO_CODEC] * 3 + [2155, 2156, 2157, NO_CODEC, 2148,
                                                     2148, 2148, 2148, 2149, 0, 16, 32, 2150]
    assert s.codec_ids[SPEAKER_POS] == NO_CODEC
    assert s.frame_mask.nonzero()[0].tolist() == [12, 13, 14]
    assert s.target_mask.nonzero()[0].tolist() == [12, 13, 14, 15]
    assert (s.sub_codes[12:15] == codes[:, 1:]).all()
    assert (s.sub_codes[:12] == NO_CODE).all() and (s.sub_codes[15] == NO_CODE).all()
    assert count_tokens([s]) == (4, 45)


def test_layout_matches_official_generation(official: Any, tiny_model_dir: Path) -> None:
    torch.manual_seed(0)
    model = official.model
    x_vector = torch.randn(model.config.talker_config.hidden_size)
    text = "Hello world, a test."
    ref = official_generate(official, text, x_vector, frames=5)
    codes = ref["codes"]
    assert codes.shape == (5, 16)

    ids = LayoutIds.from_config(model.config)
    role, text_ids = tokenize(official.processor.tokenizer, text)
    seq = build_sequence(ids, role, text_ids, codes.numpy())
    batch = collate([seq], ids)
    batch["x_vector"] = x_vector.numpy()[None]
    batch = batch_to_device(batch, "cpu")
    objective = VoiceObjective(model.talker).eval()

    with torch.no_grad():
        embeds = objective.embed(batch)[0]
        # Generation fed every position except the final eos (never an input there).
        n_in = ref["inputs"].shape[0]
        assert n_in == seq.length - 1
        torch.testing.assert_close(embeds[:n_in], ref["inputs"], rtol=0, atol=1e-5)

        hidden = objective.talker_hidden(embeds[None])[0]
        first = int(np.flatnonzero(seq.frame_mask)[0])
        prev = hidden[first - 1:first - 1 + 5]
        torch.testing.assert_close(prev, ref["hidden"], rtol=0, atol=1e-5)

        # Teacher forcing reproduces greedy generation: codebook 0 from the talker
        # (with generation's suppression of specials), codebooks 1..15 from the
        # code predictor fed the hidden state before each frame.
        logits = model.talker.codec_head(prev)
        logits[:, 2048:] = float("-inf")
        assert logits.argmax(-1).tolist() == codes[:, 0].tolist()
        sub = objective.subtalker_logits(prev, codes)
        assert sub.argmax(-1).tolist() == codes[:, 1:].tolist()


def test_collate_right_pads_without_changing_real_positions(official: Any) -> None:
    """Padding a short clip next to a long one leaves its hidden states unchanged."""
    model = official.model
    ids = LayoutIds.from_config(model.config)
    tok = official.processor.tokenizer
    g = torch.Generator().manual_seed(1)
    short = build_sequence(ids, *tokenize(tok, "Short."),
                           torch.randint(0, 2048, (3, 16), generator=g).numpy())
    long = build_sequence(ids, *tokenize(tok, "A much longer sentence here."),
                          torch.randint(0, 2048, (9, 16), generator=g).numpy())
    xv = torch.randn(1, model.config.talker_config.hidden_size, generator=g).numpy()
    objective = VoiceObjective(model.talker).eval()
    with torch.no_grad():
        alone = collate([short], ids) | {"x_vector": xv}
        both = collate([short, long], ids) | {"x_vector": np.repeat(xv, 2, axis=0)}
        h1 = objective.talker_hidden(objective.embed(batch_to_device(alone, "cpu")))
        h2 = objective.talker_hidden(objective.embed(batch_to_device(both, "cpu")))
    assert both["attention_mask"][0].sum() == short.length
    torch.testing.assert_close(h2[0, :short.length], h1[0], rtol=0, atol=1e-5)
