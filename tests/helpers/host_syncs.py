"""Counting the ops that would make a GPU stop the host (read a value back), on any device.

`SyncCounter` is a `TorchDispatchMode` that sees every aten call: `_local_scalar_dense`
(`.item()`, `float()`, `bool()` of a tensor), the ops whose output size lives on the
device (`nonzero`, `masked_select`) and boolean-mask indexing are noted in `hits`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNCING = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select",
           "aten::item", "aten::is_nonzero"}


class SyncCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.hits: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name
        if name in SYNCING:
            self.hits.append(name)
        elif name in ("aten::index", "aten::index_put", "aten::index_put_"):
            # a boolean index is turned into positions inside the kernel: a size read back
            indices = args[1] if len(args) > 1 else []
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
                self.hits.append(name + "(bool)")
        return func(*args, **(kwargs or {}))
