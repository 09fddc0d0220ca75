"""Adapter voices (issue 30, tier 2): a LoRA run's adapters and speaker row on the base
they were trained on; merged, they are the run's full export; PEFT loads them too."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from engine.catalog import list_tiers
from engine.cli.main import cli_words
from engine.config.speak import SpeakOptions
from engine.core.errors import InputError, ModelError
from engine.core.kinds import Tier
from engine.layout.checkpoints import checkpoint_name
from engine.layout.tiers import (
    ADAPTER_WEIGHTS,
    PEFT_CONFIG,
    PEFT_WEIGHTS,
    folder_size,
    run_adapter_dir,
)
from engine.model.adapter import load_adapter, weights_fingerprint
from engine.model.checkpoint_weights import trained_weights
from engine.model.export import CODEC_EMBEDDING, SPEAKER_ROW
from engine.model.loading import load_model
from engine.model.tiny import make_tiny_model
from engine.prepare.instant import make_instant_voice
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import resolve_source
from engine.train.driver import train
from engine.train.export import export
from engine.train.lora import TARGETS, initial_value
from engine.train.request import TrainRequest
from tests.helpers.parity import assert_same_codes, record_choices
from tests.helpers.runs import LORA_ALPHA, LORA_RANK, LORA_STEPS
from tests.helpers.voices import copy_voice

PREDICTOR_LAYERS = "talker.code_predictor.model.layers."


def _exported(run: dict[str, Any], name: str, root: Path) -> dict[str, Any]:
    """The run's last step exported as an adapter voice (PEFT files too) into a copy."""
    voice = copy_voice(run["voice"], root / "joe")
    shutil.rmtree(run_adapter_dir(voice, name))  # the one the run wrote: this test's own
    out = export(voice, voice / "exports" / "joe-adapter", run=name, adapter=True, peft=True)
    return {**run, "voice": voice, "adapter": Path(out["out_dir"]), "result": out}


@pytest.fixture(scope="module")
def adapter_voice(lora_run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
                  ) -> dict[str, Any]:
    return _exported(lora_run, "lora", tmp_path_factory.mktemp("adapter"))


@pytest.fixture(scope="module")
def predictor_voice(lora_predictor_run: dict[str, Any],
                    tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same of the run with adapters on the code predictor too."""
    return _exported(lora_predictor_run, "lorap", tmp_path_factory.mktemp("predictor"))


def test_a_lora_run_with_the_predictor_option_trains_the_code_predictor_s_adapters(
        predictor_voice: dict[str, Any], adapter_voice: dict[str, Any],
        tiny_model_dir: Path) -> None:
    voice = load_adapter(predictor_voice["adapter"])
    predictor = {k: v for k, v in voice.tensors.items() if k.startswith(PREDICTOR_LAYERS)}
    talker = load_model(tiny_model_dir, "cpu", torch.float32).model.talker
    assert len(predictor) == 2 * len(TARGETS) * len(talker.code_predictor.model.layers)
    # B started at zero and A at its seeded value: two steps moved both
    for key, value in predictor.items():
        assert not torch.equal(value.float(), initial_value(key, tuple(value.shape))), key
    # the talker's adapters as before, beside them; the default run's on the talker alone
    talker_only = load_adapter(adapter_voice["adapter"]).tensors
    assert set(voice.tensors) - set(predictor) == set(talker_only)
    assert not any(k.startswith(PREDICTOR_LAYERS) for k in talker_only)
    # and its adapter voice merges to its full export, the predictor's weights included
    exported = load_file(str(predictor_voice["export"] / "model.safetensors"))
    merged = voice.merged(tiny_model_dir)
    for key in predictor:
        weight = key.rsplit(".lora_", 1)[0] + ".weight"
        torch.testing.assert_close(merged[weight].to(exported[weight].dtype), exported[weight])


def test_adapter_voice_is_small_names_its_base_and_merges_to_the_full_export(
        adapter_voice: dict[str, Any], tiny_model_dir: Path) -> None:
    folder, full = adapter_voice["adapter"], adapter_voice["export"]
    assert adapter_voice["result"]["tier"] == Tier.ADAPTER
    voice = load_adapter(folder)
    assert voice.info["base"] == str(tiny_model_dir)
    assert voice.info["base_fingerprint"] == weights_fingerprint(tiny_model_dir)
    assert (voice.info["rank"], voice.info["alpha"]) == (LORA_RANK, LORA_ALPHA)
    # unmerged: only the adapters travel (the tiny model's talker is small, so the
    # ratio is far from 1.7B's tens of MB of 3.4 GB, but it must be well under the whole)
    assert all(k.endswith((".lora_A", ".lora_B")) for k in voice.tensors)
    assert folder_size(folder) < 0.5 * (full / "model.safetensors").stat().st_size
    exported = load_file(str(full / "model.safetensors"))
    merged = voice.merged(tiny_model_dir)
    ckpt = adapter_voice["run"] / checkpoint_name(LORA_STEPS)
    direct = trained_weights(ckpt, tiny_model_dir, LORA_ALPHA / LORA_RANK)
    assert set(merged) == set(direct)
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, direct[name], rtol=0, atol=0)
        torch.testing.assert_close(tensor.to(exported[name].dtype), exported[name])
    torch.testing.assert_close(voice.x_vector.to(exported[CODEC_EMBEDDING].dtype),
                               exported[CODEC_EMBEDDING][SPEAKER_ROW])
    tiers = {t["tier"]: t for t in list_tiers(adapter_voice["voice"])}
    assert tiers[Tier.ADAPTER]["name"] == "joe-adapter"
    assert tiers[Tier.ADAPTER]["base"] == str(tiny_model_dir)


def test_an_adapter_on_another_base_refuses_naming_the_one_it_needs(
        adapter_voice: dict[str, Any], tiny_model_dir: Path, tmp_path: Path) -> None:
    other = make_tiny_model(tmp_path / "other-base", seed=1)  # same shapes, other weights
    voice = load_adapter(adapter_voice["adapter"])
    with pytest.raises(ModelError, match=f"Speak it on {tiny_model_dir}"):
        voice.merged(other)


def test_a_run_without_adapters_has_no_adapter_voice(trained_run: dict[str, Any],
                                                      tmp_path: Path) -> None:
    voice = copy_voice(trained_run["voice"], tmp_path / "joe")
    with pytest.raises(InputError, match="trained no LoRA adapters"):
        export(voice, tmp_path / "out", run="r1", adapter=True)
    assert not (tmp_path / "out").exists()


def test_predictor_adapters_without_lora_refuse_in_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="needs trainable set to lora") as err:
        TrainRequest.of(tmp_path, "base", lora_predictor=True).validated()
    # the CLI says it in flags
    assert "needs --trainable set to lora" in err.value.worded(cli_words)[0]
    TrainRequest.of(tmp_path, "base", trainable="lora", lora_predictor=True).validated()


def test_a_resumed_run_keeps_the_adapters_it_has(lora_run: dict[str, Any],
                                                  tiny_model_dir: Path, tmp_path: Path) -> None:
    voice = copy_voice(lora_run["voice"], tmp_path / "joe")
    with pytest.raises(InputError, match="trains no adapters on the code predictor"):
        train(voice, str(tiny_model_dir), resume=True, run="lora", steps=LORA_STEPS + 1,
              trainable="lora", lora_predictor=True, use_gpu=False, dry_run=True)


def _talker_logits(model: Any, embeds: torch.Tensor) -> torch.Tensor:
    talker = model.talker
    return talker.codec_head(talker.model(inputs_embeds=embeds).last_hidden_state)


def _predictor_logits(model: Any, embeds: torch.Tensor) -> torch.Tensor:
    """Codebook 1's logits of the code predictor's stack on `embeds` (its own width)."""
    predictor = model.talker.code_predictor
    return predictor.lm_head[0](predictor.model(inputs_embeds=embeds).last_hidden_state)


@pytest.mark.parity
@pytest.mark.parametrize("which", ["adapter_voice", "predictor_voice"])
def test_peft_loads_the_adapter_onto_the_official_model_as_our_merged_export(
        which: str, request: pytest.FixtureRequest, tiny_model_dir: Path) -> None:
    from peft import PeftModel

    exported = request.getfixturevalue(which)
    folder = exported["adapter"]
    assert (folder / PEFT_CONFIG).is_file() and (folder / PEFT_WEIGHTS).is_file()
    assert (folder / ADAPTER_WEIGHTS).is_file()
    ours = load_model(exported["export"], "cpu", torch.float32).model
    base = load_model(tiny_model_dir, "cpu", torch.float32).model
    peft_model = PeftModel.from_pretrained(base, str(folder)).eval()
    plain_model = load_model(tiny_model_dir, "cpu", torch.float32).model
    g = torch.Generator().manual_seed(0)
    stacks = [(_talker_logits, ours.talker.config.hidden_size)]
    if which == "predictor_voice":
        stacks.append((_predictor_logits, ours.talker.code_predictor.config.hidden_size))
    for logits, hidden in stacks:
        embeds = torch.randn(2, 12, hidden, generator=g)
        with torch.no_grad():
            want = logits(ours, embeds)
            got = logits(peft_model.base_model.model, embeds)
            plain = logits(plain_model, embeds)
        # the adapters do change the stack, and PEFT applies them as our merge does
        assert not torch.allclose(plain, want, atol=1e-4), logits.__name__
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=logits.__name__)
    if which == "adapter_voice":  # a talker-only adapter leaves the predictor the base's
        embeds = torch.randn(2, 12, ours.talker.code_predictor.config.hidden_size, generator=g)
        with torch.no_grad():
            torch.testing.assert_close(_predictor_logits(peft_model.base_model.model, embeds),
                                       _predictor_logits(plain_model, embeds), rtol=0, atol=0)


GREEDY = SpeakOptions(do_sample=False, subtalker_do_sample=False, seed=0, max_frames=40,
                      loudness_lufs=None)
TEXT = "Hello there, this is a test."


@pytest.mark.parity
@pytest.mark.parametrize("which", ["adapter_voice", "predictor_voice"])
def test_an_adapter_voice_speaks_as_its_merged_export_and_switches_on_one_base(
        which: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    adapter_voice = request.getfixturevalue(which)
    source = resolve_source(adapter_voice["voice"])  # no full export in it: the adapter
    assert source.kind == "adapter" and source.label == "joe-adapter"
    exported = Synthesizer.load(resolve_source(adapter_voice["export"]), device="cpu",
                                dtype="float32")
    want = exported.speak(TEXT, GREEDY).codes[0]
    synth = Synthesizer.load(source, device="cpu", dtype="float32")
    with record_choices(monkeypatch) as log:
        got = synth.speak(TEXT, GREEDY).codes[0]
    assert len(want) >= 5
    assert_same_codes(got, want, log, synth.fast.eos)
    # to the base's zero-shot voice and back, on the same loaded model
    model = synth.model
    clip = next((adapter_voice["voice"] / "prepared" / "clips").glob("*.wav"))
    synth.use_source(resolve_source(source.model_dir, reference=clip, x_vector_only=True))
    assert not torch.equal(synth.speak(TEXT, GREEDY).codes[0], got)
    synth.use_source(source)
    assert synth.model is model and torch.equal(synth.speak(TEXT, GREEDY).codes[0], got)


def test_serve_lists_every_tier_with_its_base_and_speaks_them(
        adapter_voice: dict[str, Any], tiny_model_dir: Path) -> None:
    """`serve --workspace`, in this process: the voice, its adapter and instant voices and
    its run are served by name, each with its tier and base, and they speak."""
    from starlette.testclient import TestClient

    from engine.serve.app import ServeConfig, create_app
    from engine.serve.pool import Pool
    from engine.serve.voices import discover

    voice = adapter_voice["voice"]
    make_instant_voice(voice, str(tiny_model_dir))
    pool = Pool(discover([], voice.parent), device="cpu", dtype="float32", rows=2,
                max_queue=4)
    with TestClient(create_app(pool, ServeConfig(timeout_s=300)),
                    base_url="http://127.0.0.1") as http:
        listed = {v["id"]: v for v in http.get("/v1/audio/voices").json()["data"]}
        assert list(listed) == ["joe", "joe/joe-adapter", "joe/instant", "joe/lora"]
        assert [listed[n]["tier"] for n in listed] == [Tier.ADAPTER, Tier.ADAPTER,
                                                       Tier.INSTANT, None]
        base = str(tiny_model_dir)
        assert listed["joe/joe-adapter"]["base"] == listed["joe/instant"]["base"] == base
        spoken = {}
        for name in ("joe/joe-adapter", "joe/instant", "joe"):
            r = http.post("/v1/audio/speech", json={
                "model": "tts-1", "voice": name, "input": "One voice of many.",
                "response_format": "wav", "max_frames": 8, "seed": 1})
            assert r.status_code == 200, (name, r.text)
            spoken[name] = r.content
        # two voices of one base are two voices, not one worker answering for both; `joe`
        # is its adapter voice, served by the adapter's worker
        assert spoken["joe/joe-adapter"] != spoken["joe/instant"]
        assert spoken["joe"] == spoken["joe/joe-adapter"]
        # one base, one model: the adapter and instant voices share its worker
        assert http.get("/health").json()["workers"] == 1
