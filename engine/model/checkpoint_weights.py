"""A run checkpoint's trained weights as official tensors: the one way they are read,
for export and for every path that speaks from a run (speak, evaluate, compare, serve,
the window's Listen).

A checkpoint (`engine.train.checkpoint`) holds the trainable parameters only, under
``model.<official name>``; frozen weights stay in the base model. A LoRA run
(`engine.train.lora`) trains ``<linear>.lora_A`` (rank x in) and ``<linear>.lora_B``
(out x rank) beside a frozen ``<linear>.weight``; `trained_weights` merges each into its
base weight, ``W + (alpha / rank) B A`` in fp32 (`merge_lora`), so what it returns has
official keys only: an export writes exactly these tensors, and a loaded model copies
exactly these in, so a checkpoint speaks as its export does.

Reading needs no process group: DCP reads every shard when none exists.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from engine.core.errors import ModelError
from engine.core.storage import Location
from engine.model.files import weight_files

LORA_A, LORA_B = ".lora_A", ".lora_B"
_HINT = "Use the base model this run was trained from (--base)."


def merge_lora(state_dict: Mapping[str, Any], scaling: float) -> dict[str, Any]:
    """Fold LoRA adapters into their base weights: ``W + scaling * B @ A`` (fp32).

    `state_dict` holds official keys plus, for a LoRA run, ``<linear>.lora_A`` and
    ``<linear>.lora_B`` next to ``<linear>.weight``. The result has official keys
    only; without adapters it is the same dict.
    """
    import torch  # noqa: PLC0415

    out = {k: v for k, v in state_dict.items() if not k.endswith((LORA_A, LORA_B))}
    for key, a in state_dict.items():
        if not key.endswith(LORA_A):
            continue
        prefix = key[: -len(LORA_A)]
        b = state_dict.get(prefix + LORA_B)
        weight = state_dict.get(prefix + ".weight")
        if b is None or weight is None:
            raise ModelError(f"The LoRA adapter {prefix} is incomplete in this checkpoint.",
                             "Pick another checkpoint of the run.")
        a32, b32 = torch.as_tensor(a).float(), torch.as_tensor(b).float()
        out[prefix + ".weight"] = torch.as_tensor(weight).float() + scaling * (b32 @ a32)
    return out


def base_tensors(model_dir: str | Path, names: Iterable[str]) -> dict[str, Any]:
    """The base model's own values of `names` (those it has), read from its safetensors."""
    from safetensors import safe_open  # noqa: PLC0415

    wanted, found = set(names), {}
    for file in weight_files(model_dir):
        with safe_open(str(file), framework="pt") as fh:
            for name in wanted & set(fh.keys()):
                found[name] = fh.get_tensor(name)
    return found


def _reader(checkpoint: Path | Location) -> Any:
    if isinstance(checkpoint, Location):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader  # noqa: PLC0415

        return FsspecReader(checkpoint.url)
    from torch.distributed.checkpoint import FileSystemReader  # noqa: PLC0415

    return FileSystemReader(str(checkpoint))


def _adapted(name: str) -> str:
    """The official weight an entry of the checkpoint ends up in."""
    for suffix in (LORA_A, LORA_B):
        if name.endswith(suffix):
            return name[: -len(suffix)] + ".weight"
    return name


def _check_fits(label: str, entries: Mapping[str, Any],
                shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Every entry lands on a tensor of `shapes` that has its size (adapters: A's inputs
    and B's outputs are the weight's)."""
    for name, meta in entries.items():
        target = _adapted(name)
        if target not in shapes:
            raise ModelError(f"The checkpoint {label} holds {name}, which the base model does "
                             "not have.", _HINT)
        size, want = tuple(getattr(meta, "size", ())), tuple(shapes[target])
        if target == name:
            fits = size == want
        elif name.endswith(LORA_A):  # (rank, in)
            fits = len(size) == 2 and size[1] == want[1]
        else:  # B: (out, rank)
            fits = len(size) == 2 and size[0] == want[0]
        if not fits:
            raise ModelError(f"The checkpoint {label} does not fit this base model ({name} is "
                             f"{size}, the model's {target} is {want}).", _HINT)


def trained_weights(checkpoint: Path | Location, base_dir: str | Path,
                    lora_scaling: float | None,
                    shapes: Mapping[str, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """The trained tensors of `checkpoint` under official names, adapters merged into the
    weights of `base_dir` with the run's `lora_scaling` (its alpha / rank; None: the run
    does not say, which only a LoRA checkpoint needs). `shapes`: the model they go into,
    checked before anything is read."""
    wanted = checkpoint_tensors(checkpoint, shapes)
    adapted = {_adapted(n) for n in wanted if n.endswith(LORA_A)}
    if not adapted:
        return wanted
    if lora_scaling is None:
        raise ModelError(f"The checkpoint {checkpoint.name} holds LoRA adapters, but its "
                         "run's config.json does not say their rank and alpha.",
                         "Put the run's config.json back (or export the run where it has one).")
    return merge_onto_base(wanted, base_dir, lora_scaling, checkpoint.name)


def merge_onto_base(tensors: Mapping[str, Any], base_dir: str | Path, lora_scaling: float,
                    label: str) -> dict[str, Any]:
    """`tensors` (official keys and `<linear>.lora_A/B`) with every adapter merged into
    its weight as `base_dir` holds it: what a checkpoint or an adapter voice speaks."""
    frozen = {_adapted(n) for n in tensors if n.endswith(LORA_A)} - set(tensors)
    base = base_tensors(base_dir, frozen)
    if set(base) != frozen:
        raise ModelError(f"The base model lacks {len(frozen - set(base))} weights the LoRA "
                         f"adapters of {label} adapt.", _HINT)
    return merge_lora({**tensors, **base}, lora_scaling)


def checkpoint_tensors(checkpoint: Path | Location,
                       shapes: Mapping[str, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """The tensors of `checkpoint` as saved, under official names, adapters unmerged
    (`<linear>.lora_A/B`): what an adapter voice keeps. `shapes` as `trained_weights`'."""
    import torch  # noqa: PLC0415
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415

    label = checkpoint.name
    reader = _reader(checkpoint)
    try:
        metadata = reader.read_metadata()
    except Exception as exc:  # any unreadable metadata means a damaged folder
        raise ModelError(f"The checkpoint {checkpoint} cannot be read ({type(exc).__name__}).",
                         "It may be damaged; pick another checkpoint of the run.") from exc
    entries = {key[len("model."):]: meta for key, meta in metadata.state_dict_metadata.items()
               if key.startswith("model.")}
    if not entries:
        raise ModelError(f"The checkpoint {checkpoint} has no model weights.",
                         "Pick another checkpoint of the run.")
    if shapes is not None:
        _check_fits(label, entries, shapes)
    wanted = {name: torch.empty(tuple(meta.size),
                                dtype=getattr(meta.properties, "dtype", torch.float32))
              for name, meta in entries.items()}
    with warnings.catch_warnings():
        # "assuming the intent is to load in a single process" is exactly the intent
        warnings.simplefilter("ignore")
        dcp.load({"model": wanted}, storage_reader=reader)
    return wanted
