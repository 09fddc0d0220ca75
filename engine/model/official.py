"""Import the official `qwen_tts` package (qwen-tts==0.1.1) without its dead weight.

`import qwen_tts` runs `qwen_tts/core/__init__.py`, which imports the 25 Hz
tokenizer, which needs torchaudio, sox and onnxruntime. None of the 12 Hz
models use it, and torchaudio from PyPI fails to load beside a CPU torch that
is not its exact twin. So when the plain import fails for that reason we
build the two package objects by hand (same files, same module names, their
`__init__` bodies skipped), import the real 12 Hz and model modules, and give
`qwen_tts.core` a 25 Hz model class that refuses to load with a clear message.
Everything Voxshard calls is the official code, unmodified.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import sys
import threading
import types
from pathlib import Path
from typing import Any

from engine.core.errors import ModelError

_lock = threading.Lock()
_module: types.ModuleType | None = None
#: True when the 25 Hz tokenizer could not be imported and was replaced
degraded_25hz = False


def _package_dir() -> Path:
    spec = importlib.util.find_spec("qwen_tts")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "The official Qwen3-TTS code (package qwen-tts) is not installed.",
            "Run: pip install --no-deps qwen-tts==0.1.1 (packaging/setup_venv.sh does this).",
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _bare_package(name: str, path: Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    module.__file__ = str(path / "__init__.py")
    module.__package__ = name
    spec = importlib.util.spec_from_loader(name, loader=None, is_package=True)
    assert spec is not None
    spec.submodule_search_locations = [str(path)]
    module.__spec__ = spec
    sys.modules[name] = module
    return module


def _unsupported_25hz(config_class: type) -> type:
    from transformers import PreTrainedModel  # noqa: PLC0415

    class Qwen3TTSTokenizerV1Model(PreTrainedModel):
        """Stands in for the 25 Hz tokenizer, which Voxshard does not support."""

        @classmethod
        def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
            raise ModelError(
                "This model uses the 25 Hz speech tokenizer, which Voxshard does not support.",
                "Use a Qwen3-TTS-12Hz model (e.g. Qwen/Qwen3-TTS-12Hz-1.7B-Base).",
            )

    Qwen3TTSTokenizerV1Model.config_class = config_class
    return Qwen3TTSTokenizerV1Model


def _import_without_25hz(root: Path) -> types.ModuleType:
    global degraded_25hz
    for name in [m for m in sys.modules if m == "qwen_tts" or m.startswith("qwen_tts.")]:
        del sys.modules[name]
    pkg = _bare_package("qwen_tts", root)
    core = _bare_package("qwen_tts.core", root / "core")
    pkg.core = core
    tok12 = "qwen_tts.core.tokenizer_12hz"
    cfg2 = importlib.import_module(f"{tok12}.configuration_qwen3_tts_tokenizer_v2")
    mod2 = importlib.import_module(f"{tok12}.modeling_qwen3_tts_tokenizer_v2")
    # The 25 Hz configuration module only needs transformers: keep the real one.
    cfg1 = importlib.import_module(
        "qwen_tts.core.tokenizer_25hz.configuration_qwen3_tts_tokenizer_v1")
    core.Qwen3TTSTokenizerV2Config = cfg2.Qwen3TTSTokenizerV2Config
    core.Qwen3TTSTokenizerV2Model = mod2.Qwen3TTSTokenizerV2Model
    core.Qwen3TTSTokenizerV1Config = cfg1.Qwen3TTSTokenizerV1Config
    core.Qwen3TTSTokenizerV1Model = _unsupported_25hz(cfg1.Qwen3TTSTokenizerV1Config)
    degraded_25hz = True
    inference = importlib.import_module("qwen_tts.inference.qwen3_tts_model")
    tokenizer = importlib.import_module("qwen_tts.inference.qwen3_tts_tokenizer")
    pkg.Qwen3TTSModel = inference.Qwen3TTSModel
    pkg.VoiceClonePromptItem = inference.VoiceClonePromptItem
    pkg.Qwen3TTSTokenizer = tokenizer.Qwen3TTSTokenizer
    pkg.__all__ = ["Qwen3TTSModel", "Qwen3TTSTokenizer", "VoiceClonePromptItem"]
    return pkg


def import_qwen_tts() -> types.ModuleType:
    """Return the official `qwen_tts` module, importing it once."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        root = _package_dir()
        # The package prints a flash-attn banner on stdout, which would corrupt
        # `--json` output; keep it out.
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                import qwen_tts  # noqa: PLC0415

                _module = qwen_tts
            except (ImportError, OSError) as exc:
                missing = getattr(exc, "name", None) or str(exc)
                if not any(k in str(missing) for k in ("torchaudio", "sox", "onnxruntime")):
                    raise ModelError(
                        f"The official Qwen3-TTS code failed to import: {exc}.",
                        "Reinstall with: bash packaging/setup_venv.sh",
                    ) from exc
                _module = _import_without_25hz(root)
        return _module


def modeling() -> types.ModuleType:
    """The official modeling module (talker, code predictor, speaker encoder)."""
    import_qwen_tts()
    return importlib.import_module("qwen_tts.core.models.modeling_qwen3_tts")


def configuration() -> types.ModuleType:
    import_qwen_tts()
    return importlib.import_module("qwen_tts.core.models.configuration_qwen3_tts")


def codec_modules() -> tuple[types.ModuleType, types.ModuleType]:
    """(configuration, modeling) modules of the 12 Hz speech tokenizer."""
    import_qwen_tts()
    base = "qwen_tts.core.tokenizer_12hz"
    return (importlib.import_module(f"{base}.configuration_qwen3_tts_tokenizer_v2"),
            importlib.import_module(f"{base}.modeling_qwen3_tts_tokenizer_v2"))
