"""The corrected loss, one test per upstream bug, each against a slow reference.

The reference below is deliberately naive and follows inference step by step:
the input of every position is written out by hand from the layout table;
the talker hidden state at position q is computed from the prefix 0..q
alone (nothing later can leak in); the sub-talker of a frame is run the way
generation runs it, one codebook at a time, head k on the newest position.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.data.layout import build_sequence, collate, count_tokens
from engine.train.loss import SUBTALKER_WEIGHT, normalisers
from engine.train.objective import (
    VoiceObjective,
    batch_to_device,
)
from tests.helpers.official import loaded_objective

# numeric parity: the fast loss against a slow step-by-step reference.
# packaging/run_tests.sh runs these again under other CPU kernel dispatches.
pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def setup(tiny_model_dir: Path) -> dict[str, Any]:
    objective, ids, width = loaded_objective(tiny_model_dir)
    g = torch.Generator().manual_seed(3)
    seqs = []
    for n_text, n_frames in [(5, 7), (3, 4), (8, 6)]:
        text = torch.randint(0, 900, (n_text,), generator=g).tolist()
        codes = torch.randint(0, 2048, (n_frames, 16), generator=g).numpy()
        seqs.append(build_sequence(ids, [1, 2, 3], text, codes))
    xv = torch.randn(len(seqs), width, generator=g)
    return {"objective": objective, "ids": ids, "seqs": seqs, "x_vector": xv}


def _batch(setup: dict[str, Any], which: list[int]) -> dict[str, torch.Tensor]:
    b = collate([setup["seqs"][i] for i in which], setup["ids"])
    b["x_vector"] = setup["x_vector"][which].numpy()
    return batch_to_device(b, "cpu")


# -- the slow reference ---------------------------------------------------------------

def _ref_input(talker: Any, seq: Any, q: int, x_vector: torch.Tensor) -> torch.Tensor:
    """Input embedding of position q, written out from the layout table."""
    text = talker.text_projection(talker.model.text_embedding(torch.tensor([seq.text_ids[q]])))[0]
    if q == 6:
        return text + x_vector
    if q < 3:
        return text
    e = text + talker.model.codec_embedding(torch.tensor([seq.codec_ids[q]]))[0]
    if seq.frame_mask[q]:
        for i in range(15):
            e = e + talker.code_predictor.model.codec_embedding[i](
                torch.tensor([seq.sub_codes[q, i]]))[0]
    return e


def _ref_hidden_at(talker: Any, inputs: torch.Tensor, q: int) -> torch.Tensor:
    """Talker output at q from the prefix 0..q only."""
    return talker.model(inputs_embeds=inputs[None, :q + 1], use_cache=False).last_hidden_state[0, q]


def _ref_subtalker(talker: Any, prev_hidden: torch.Tensor, codes: np.ndarray,
                   head_offset: int = 0) -> list[torch.Tensor]:
    """Per-codebook CE of one frame, generation-style: head k on the newest position.

    head_offset=1 reproduces upstream's bug 4 (head k scored against codebook k+1).
    """
    cp = talker.code_predictor
    seq = [prev_hidden, talker.model.codec_embedding(torch.tensor([int(codes[0])]))[0]]
    losses = []
    for k in range(1, 16 - head_offset):
        h = cp.model(inputs_embeds=cp.small_to_mtp_projection(torch.stack(seq))[None],
                     use_cache=False).last_hidden_state[0, -1]
        logits = cp.lm_head[k - 1](h)
        losses.append(F.cross_entropy(logits[None], torch.tensor([int(codes[k + head_offset])])))
        if k < 15:
            seq.append(cp.model.codec_embedding[k - 1](torch.tensor([int(codes[k])]))[0])
    return losses


def _reference(setup: dict[str, Any], which: list[int], *, label_shift: int = 1,
               sub_hidden_at_frame: bool = False, head_offset: int = 0) -> dict[str, float]:
    """Mean losses; the keyword arguments reproduce upstream's bugs 2, 3 and 4."""
    talker = setup["objective"].talker
    t_losses: list[torch.Tensor] = []
    s_losses: list[torch.Tensor] = []
    for i in which:
        seq = setup["seqs"][i]
        xv = setup["x_vector"][i]
        inputs = torch.stack([_ref_input(talker, seq, q, xv) for q in range(seq.length)])
        for q in range(seq.length - label_shift):
            if seq.target_mask[q + label_shift]:
                h = _ref_hidden_at(talker, inputs, q)
                label = torch.tensor([int(seq.codec_ids[q + label_shift])])
                t_losses.append(F.cross_entropy(talker.codec_head(h)[None], label))
        for p in np.flatnonzero(seq.frame_mask):
            # right: the state that predicted this frame's codebook 0 (p-1)
            h = _ref_hidden_at(talker, inputs, int(p) if sub_hidden_at_frame else int(p) - 1)
            codes = np.concatenate([[seq.codec_ids[p]], seq.sub_codes[p]])
            s_losses.extend(_ref_subtalker(talker, h, codes, head_offset))
    talker_mean = torch.stack(t_losses).mean().item()
    sub_mean = torch.stack(s_losses).mean().item()
    return {"talker": talker_mean, "subtalker": sub_mean,
            "total": talker_mean + SUBTALKER_WEIGHT * sub_mean}


@pytest.fixture(scope="module")
def fast(setup: dict[str, Any]) -> dict[str, float]:
    with torch.no_grad():
        out = setup["objective"](_batch(setup, [0, 1, 2]))
    return {k: float(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def ref(setup: dict[str, Any]) -> dict[str, float]:
    with torch.no_grad():
        return _reference(setup, [0, 1, 2])


def test_total_equals_reference(fast: dict[str, float], ref: dict[str, float],
                                setup: dict[str, Any]) -> None:
    assert fast["loss"] == pytest.approx(ref["total"], rel=1e-5)
    t, s = count_tokens(setup["seqs"])
    assert (fast["talker_tokens"], fast["subtalker_tokens"]) == (t, s)


def test_bug1_text_projection_applied(setup: dict[str, Any]) -> None:
    """Text positions carry text_projection(text_embedding(id)), as at inference."""
    objective: VoiceObjective = setup["objective"]
    talker = objective.talker
    seq = setup["seqs"][0]
    with torch.no_grad():
        emb = objective.embed(_batch(setup, [0]))[0]
        for q in (0, 1, 2, 8, 9):  # role tokens, then real text tokens
            want = _ref_input(talker, seq, q, setup["x_vector"][0])
            torch.testing.assert_close(emb[q], want, rtol=0, atol=1e-6)
    # Without the projection the text width (32) is not even the talker width
    # (64): upstream's omission crashes on such a model, as it does on 0.6B.
    assert talker.model.text_embedding.embedding_dim != talker.config.hidden_size
    # And the projection is in the graph: it gets a gradient.
    objective.zero_grad()
    objective(_batch(setup, [0]))["loss"].backward()
    g = talker.text_projection.linear_fc1.weight.grad
    assert g is not None and g.abs().sum() > 0
    objective.zero_grad()


def test_bug2_talker_shifted_once(fast: dict[str, float], ref: dict[str, float],
                                  setup: dict[str, Any]) -> None:
    assert fast["talker"] == pytest.approx(ref["talker"], rel=1e-5)
    with torch.no_grad():
        double = _reference(setup, [0, 1, 2], label_shift=2)
    # The check can tell: the doubly shifted (upstream) loss is a different number.
    assert abs(double["talker"] - fast["talker"]) > 1e-3


def test_bug3_subtalker_reads_hidden_before_frame(fast: dict[str, float], ref: dict[str, float],
                                                  setup: dict[str, Any]) -> None:
    assert fast["subtalker"] == pytest.approx(ref["subtalker"], rel=1e-5)
    with torch.no_grad():
        upstream = _reference(setup, [0, 1, 2], sub_hidden_at_frame=True)
    assert abs(upstream["subtalker"] - fast["subtalker"]) > 1e-3


def test_bug4_head_i_scores_codebook_i(fast: dict[str, float], ref: dict[str, float],
                                       setup: dict[str, Any]) -> None:
    assert fast["subtalker"] == pytest.approx(ref["subtalker"], rel=1e-5)
    with torch.no_grad():
        upstream = _reference(setup, [0, 1, 2], head_offset=1)
    assert abs(upstream["subtalker"] - fast["subtalker"]) > 1e-3
    # Every one of the 15 heads gets a gradient (upstream never trains the last).
    objective: VoiceObjective = setup["objective"]
    objective.zero_grad()
    objective(_batch(setup, [0, 1]))["loss"].backward()
    for head in objective.talker.code_predictor.lm_head:
        assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0
    objective.zero_grad()


def test_split_batch_gradients_equal_full_batch(setup: dict[str, Any]) -> None:
    """Two 'ranks' with token-count normalisers average to the full-batch gradient."""
    objective: VoiceObjective = setup["objective"]
    params = [p for p in objective.parameters() if p.requires_grad]

    def grads(batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        objective.zero_grad()
        objective(batch)["loss"].backward()
        return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]

    full = grads(_batch(setup, [0, 1, 2]))
    t, s = count_tokens(setup["seqs"])
    norm_t, norm_s = normalisers(t, s, world=2)
    parts = []
    for which in ([0, 2], [1]):  # unequal halves: a plain mean of means would be wrong
        b = _batch(setup, which)
        b["talker_norm"] = torch.tensor(norm_t)
        b["subtalker_norm"] = torch.tensor(norm_s)
        parts.append(grads(b))
    objective.zero_grad()
    for f, a, b in zip(full, *parts, strict=True):
        torch.testing.assert_close((a + b) / 2, f, rtol=1e-4, atol=1e-7)


def test_accumulated_micro_batches_equal_one_batch(setup: dict[str, Any]) -> None:
    """grad_accum micro-batches, each with its step's normalisers and loss / accum, sum
    to the gradient of the whole batch at once (what the worker loop does)."""
    objective: VoiceObjective = setup["objective"]
    params = [p for p in objective.parameters() if p.requires_grad]
    objective.zero_grad()
    objective(_batch(setup, [0, 1, 2]))["loss"].backward()
    full = [p.grad.clone() for p in params]
    objective.zero_grad()
    t, s = count_tokens(setup["seqs"])
    accum = 2
    for which in ([1], [0, 2]):
        b = _batch(setup, which)
        b["talker_norm"] = torch.tensor(t / accum)
        b["subtalker_norm"] = torch.tensor(s / accum)
        (objective(b)["loss"] / accum).backward()
    for p, f in zip(params, full, strict=True):
        torch.testing.assert_close(p.grad, f, rtol=1e-4, atol=1e-7)
    objective.zero_grad()
