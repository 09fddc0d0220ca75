"""Style descriptions in training: the instruction sits where official inference puts it.

- The instruction's tokens equal the official prompt builder's (`_build_instruct_text`
  tokenized by `_tokenize_texts`), and a described clip laid out for training feeds
  the talker exactly the embeddings official `generate(instruct_ids=...)` feeds it, with
  the same hidden states before every frame (so training and speaking build one prefix).
- The loss never covers the instruction: a described clip has the targets of the same
  clip without it, and a batch mixing described and plain rows gives the loss sums and
  gradients of those rows run one by one.
- The prepared manifest's `style` reaches the data loader; `data.plain_share` of the
  described clips train without it, chosen per clip by the seed (same on every rank and
  after a resume).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.config.data import DataConfig
from engine.data import layout
from engine.data.codes import extract_codes
from engine.data.dataset import VoiceData, trains_plain
from engine.layout.manifest import read_manifest, write_manifest
from engine.train.objective import (
    VoiceObjective,
    batch_to_device,
)
from tests.helpers.official import load_official, loaded_objective, official_generate

pytestmark = pytest.mark.parity

STYLE = "Whisper, slowly and calmly."


@pytest.fixture(scope="module")
def official(tiny_model_dir: Path) -> Any:
    return load_official(tiny_model_dir)


def test_instruction_tokens_equal_the_official_prompt_builders(official: Any) -> None:
    tok = official.processor.tokenizer
    for style in (STYLE, "fast", "Read this as if you just heard great news!"):
        want = official._tokenize_texts([official._build_instruct_text(style)])[0][0].tolist()
        assert layout.tokenize_instruct(tok, style) == want
    assert layout.tokenize_instruct(tok, "  ") == []  # the official code skips an empty instruction


def test_described_clip_feeds_what_official_generation_feeds(official: Any) -> None:
    """Official `generate` with an instruction, greedy, an x-vector speaker and no
    language (the custom-voice prompt): its talker inputs equal our layout's, position by
    position, and teacher forcing reproduces the codes it generated."""
    torch.manual_seed(4)
    model = official.model
    x_vector = torch.randn(model.config.talker_config.hidden_size)
    text = "Hello world, a test."
    frames = 5
    ref = official_generate(official, text, x_vector, frames, instruct=STYLE)
    fed, codes = ref["inputs"], ref["codes"]

    ids = layout.LayoutIds.from_config(model.config)
    tok = official.processor.tokenizer
    instruct = layout.tokenize_instruct(tok, STYLE)
    k = len(instruct)
    seq = layout.build_sequence(ids, *layout.tokenize(tok, text), codes.numpy(), instruct)
    assert seq.speaker_pos == layout.SPEAKER_POS + k
    assert (seq.codec_ids[:k] == layout.NO_CODEC).all() and not seq.target_mask[:k].any()
    batch = layout.collate([seq], ids) | {"x_vector": x_vector.numpy()[None]}
    batch = batch_to_device(batch, "cpu")
    objective = VoiceObjective(model.talker).eval()
    with torch.no_grad():
        embeds = objective.embed(batch)[0]
        assert fed.shape[0] == seq.length - 1  # every position but the final eos
        torch.testing.assert_close(embeds[:-1], fed, rtol=0, atol=1e-5)
        h = objective.talker_hidden(embeds[None])[0]
        first = int(np.flatnonzero(seq.frame_mask)[0])
        before = h[first - 1:first - 1 + frames]  # the states that chose each frame
        torch.testing.assert_close(before, ref["hidden"], rtol=0, atol=1e-5)
        logits = model.talker.codec_head(before)
        logits[:, 2048:] = float("-inf")
        assert logits.argmax(-1).tolist() == codes[:, 0].tolist()


@pytest.fixture(scope="module")
def rows(tiny_model_dir: Path) -> dict[str, Any]:
    objective, ids, width = loaded_objective(tiny_model_dir)
    rng = np.random.default_rng(7)
    # two described rows with instructions of different lengths between them, one plain
    shapes = [(5, 7, [11, 12, 13, 14]), (3, 4, []), (6, 5, [21, 22])]
    seqs = [layout.build_sequence(ids, [1, 2, 3], rng.integers(0, 900, n).tolist(),
                           rng.integers(0, 2048, (f, 16)), instruct) for n, f, instruct in shapes]
    xv = torch.from_numpy(rng.standard_normal((len(seqs), width)).astype(np.float32))
    return {"objective": objective, "ids": ids, "seqs": seqs, "x_vector": xv}


def _batch(rows: dict[str, Any], which: list[int]) -> dict[str, torch.Tensor]:
    b = layout.collate([rows["seqs"][i] for i in which], rows["ids"])
    b["x_vector"] = rows["x_vector"][which].numpy()
    return batch_to_device(b, "cpu")


def test_a_batch_with_instructions_equals_its_rows_one_by_one(rows: dict[str, Any]) -> None:
    objective: VoiceObjective = rows["objective"]
    params = [p for p in objective.parameters() if p.requires_grad]

    def sums(which: list[int]) -> tuple[float, float]:
        with torch.no_grad():
            out = objective(_batch(rows, which))
        return float(out["talker_sum"]), float(out["subtalker_sum"])

    t_all, s_all = sums([0, 1, 2])
    singles = [sums([i]) for i in range(3)]
    assert t_all == pytest.approx(sum(t for t, _ in singles), rel=1e-5)
    assert s_all == pytest.approx(sum(s for _, s in singles), rel=1e-5)
    # gradients: the batch's mean over all its tokens is the rows' sums over that count
    t_all_n, s_all_n = layout.count_tokens(rows["seqs"])
    objective.zero_grad()
    b = _batch(rows, [0, 1, 2])
    objective(b)["loss"].backward()
    full = [p.grad.clone() for p in params]
    objective.zero_grad()
    for i in range(3):
        b = _batch(rows, [i])
        b["talker_norm"] = torch.tensor(float(t_all_n))
        b["subtalker_norm"] = torch.tensor(float(s_all_n))
        objective(b)["loss"].backward()
    for p, f in zip(params, full, strict=True):
        torch.testing.assert_close(p.grad, f, rtol=1e-4, atol=1e-7)
    objective.zero_grad()


def test_the_loss_never_covers_the_instruction(rows: dict[str, Any]) -> None:
    """The same clip with and without an instruction: the same targets and token counts;
    the instruction only changes what the speech is conditioned on."""
    ids = rows["ids"]
    g = np.random.default_rng(2)
    text, codes = g.integers(0, 900, 5).tolist(), g.integers(0, 2048, (6, 16))
    plain = layout.build_sequence(ids, [1, 2, 3], text, codes)
    told = layout.build_sequence(ids, [1, 2, 3], text, codes, [31, 32, 33])
    assert layout.count_tokens([plain]) == layout.count_tokens([told])
    assert (told.codec_ids[3:][told.target_mask[3:]] == plain.codec_ids[plain.target_mask]).all()
    objective: VoiceObjective = rows["objective"]
    xv = rows["x_vector"][:1].numpy()
    with torch.no_grad():
        a = objective(batch_to_device(layout.collate([plain], ids) | {"x_vector": xv}, "cpu"))
        b = objective(batch_to_device(layout.collate([told], ids) | {"x_vector": xv}, "cpu"))
    assert float(a["talker_tokens"]) == float(b["talker_tokens"])
    # the instruction is in the context: the loss of the same speech differs
    assert float(a["loss"]) != pytest.approx(float(b["loss"]), rel=1e-6)


def test_manifest_styles_reach_the_loader_with_a_plain_share(coded_voice: Path,
                                                            tiny_model_dir: Path,
                                                            tmp_path: Path) -> None:
    voice = tmp_path / "joe"
    shutil.copytree(coded_voice, voice)
    rows = read_manifest(voice, usable_only=False)
    for r in rows:
        r["style"] = STYLE
    write_manifest(voice, rows)
    # what every training start does first: the index (what workers read) takes the styles
    extract_codes(voice, tiny_model_dir)
    cfg = DataConfig(batch_size=2, val_fraction=0.0, plain_share=0.3, seed=5)
    data = VoiceData.open(voice, tiny_model_dir, cfg)
    described = {c.id for c in data.train if c.instruct_ids}
    plain = {c.id for c in data.train if not c.instruct_ids}
    assert described and plain  # 12 clips at a 0.3 share: both kinds
    assert plain == {c.id for c in data.train if trains_plain(c.id, 5, 0.3)}
    again = VoiceData.open(voice, tiny_model_dir, cfg)  # a resumed run lays out the same
    assert {c.id for c in again.train if c.instruct_ids} == described
    clip = next(c for c in data.train if c.instruct_ids)
    seq = data.sequence(clip)
    assert seq.length == clip.length
    assert seq.speaker_pos == layout.SPEAKER_POS + len(clip.instruct_ids)
    batch = data.collate(data.train[:2])
    assert batch["speaker_pos"].shape == (2,)
    assert data.summary()["styled_clips"] == len(described)
    none = VoiceData.open(voice, tiny_model_dir, DataConfig(batch_size=2, val_fraction=0.0,
                                                            plain_share=1.0))
    assert not any(c.instruct_ids for c in none.train)
