"""What the GPU proofs need before any work: the modules of the device kit (and the
transformers line the official model code is written for), named in one line with how to
get them, and the GPU's name read through NVML (no CUDA context in this process).

Standard library only at import: a bare Python must be able to say what is missing.
"""

from __future__ import annotations

import importlib
import importlib.util

#: (module, what provides it); checked in this order before any work
NEEDED = (("torch", "torch"), ("numpy", "numpy"), ("safetensors", "safetensors"),
          ("einops", "einops"), ("psutil", "psutil"), ("yaml", "pyyaml"),
          ("tokenizers", "the device kit"), ("huggingface_hub", "the device kit"),
          ("transformers", "the device kit"), ("librosa", "the device kit"),
          ("soundfile", "the device kit"))
KIT_HINT = ("get it with the device kit: bash bench/device_kit.sh --python-version X.Y where "
            "the package registry is reachable, then on this machine pip install --no-index "
            "--no-deps --target build/device-kit/site build/device-kit/*.whl and run with "
            "PYTHONPATH=$PWD/build/device-kit/site")


def check_environment(also: tuple[tuple[str, str], ...] = ()) -> str | None:
    """One line naming every missing module or wrong version, or None when all is there
    (`NEEDED` and `also`: more (module, what provides it) pairs, e.g. the speech proof's).

    The official model code (qwen-tts 0.1.1) is written against transformers
    4.57.3: with 5.x its rotary init fails (ROPE_INIT_FUNCTIONS has no
    "default"), so a 5.x transformers is named like a missing one.
    """
    problems: list[str] = []
    for module, source in NEEDED + also:
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # any failure to import is a missing piece, said in one line
            first = (str(exc).splitlines() or [""])[0][:120]
            problems.append(f"{module} ({source}; {type(exc).__name__}: {first})")
            continue
        if module == "transformers" and not str(mod.__version__).startswith("4.57."):
            problems.append(f"transformers 4.57.x (found {mod.__version__}; the official model "
                            "code needs 4.57.3)")
    if importlib.util.find_spec("qwen_tts") is None:
        problems.append("qwen_tts (the device kit: qwen-tts 0.1.1)")
    if not problems:
        try:  # the official modules, as the product imports them (no 25 Hz sox/onnx needs)
            from engine.model.official import modeling

            modeling()
        except Exception as exc:
            first = (str(exc).splitlines() or [""])[0][:160]
            problems.append(f"the official model code ({type(exc).__name__}: {first})")
    if not problems:
        return None
    return f"gpu_proof: missing {', '.join(problems)}; {KIT_HINT}."


def gpu_name() -> str | None:
    """The first visible GPU's name, through NVML (no CUDA context in this process)."""
    try:
        from engine.train.gpus import visible_gpus

        gpus = visible_gpus()
    except Exception:
        return None
    return gpus[0].name if gpus else None
