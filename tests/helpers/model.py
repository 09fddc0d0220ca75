"""Model fixtures: the tiny random Qwen3-TTS model, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.model.tiny import make_tiny_model
from tests.helpers.kept import kept


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return kept("tiny_model_dir", lambda: make_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-base", seed=0))
