"""Adapter voices inside the batch: one base model, each row with its own LoRA.

`AdapterPool` holds every loaded adapter voice of a `FastTalker` in stacked device
tensors, one pair per adapted projection (q, k, v, o, gate, up, down of each talker
layer, then, once a voice adapts the code predictor too, of each predictor layer):
A [slots, rank, in] and B [slots, out, rank], the voice's scale (alpha / rank)
folded into B. A pool without predictor layers costs a talker-only voice nothing more;
a voice that adapts the predictor makes the pool anew with them (as a larger rank does),
and in it a talker-only voice's predictor slots stay zero. A slot is written whole when
a voice takes it and the others are left uninitialised, so on CPU a pool's spare capacity
is never touched and costs no resident memory. Slot 0 stays all zeros: a row
without an adapter gets the base's numbers exactly (x + 0 is x). Capacity and rank are
fixed when a pool is made, so a frame captured as a CUDA graph keeps reading the same
tensors while voices come and go; only a pool that must grow (more voices than slots, a
larger rank, the predictor's layers) is made anew, and a `RowBatch` that sees another
pool drops its graphs.

A frame hands the talker stack `RowAdapters(pool, index)` (index [B]: each row's slot,
a device tensor) and the code predictor's 15 passes its `predictor()` part: every
adapted projection gathers its rows' A and B (once per frame: the predictor's passes
reuse them) and adds `(x A^T) B^T` for the whole batch with two batched matrix
products, never one row at a time. The adapters stay unmerged, so a row's numbers
differ from its merged export's by float rounding only (the parity tests' near-tie rule).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

import torch

from engine.core.errors import ModelError

#: the adapted projections of a talker layer, in the order `_Stack.forward` applies them
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
Q_PROJ, K_PROJ, V_PROJ, O_PROJ, GATE_PROJ, UP_PROJ, DOWN_PROJ = range(len(PROJECTIONS))
_KEY = re.compile(r"^talker\.(model|code_predictor\.model)\.layers\.(\d+)\.(" + "|".join(
    re.escape(p) for p in PROJECTIONS) + r")\.lora_([AB])$")


def _slots_for(needed: int) -> int:
    """Slots (slot 0 included) for `needed`: half as many again, so growth (which makes
    the captured graphs anew) is rare and an idle slot costs little memory."""
    return max(4, (needed * 3 + 1) // 2)


class AdapterPool:
    """Fixed-capacity stacks of adapters on the device (see the module doc)."""

    def __init__(self, shapes: list[list[tuple[int, int]]], slots: int, rank: int,
                 device: torch.device, dtype: torch.dtype, talker_layers: int | None = None
                 ) -> None:
        #: (out, in) of each projection of each layer: the talker's, then the predictor's
        self.shapes = shapes
        #: how many of them are the talker's (the rest: the code predictor's)
        self.talker_layers = len(shapes) if talker_layers is None else talker_layers
        self.slots = slots  # slot 0 included
        self.rank = rank
        # one allocation for the whole pool, every A and B a view of it: a pool the voices
        # grew out of goes back to the system whole when it is freed (hundreds of blocks
        # of under 1 MB each stayed in the C allocator's heap, resident, on CPU)
        sizes = [slots * rank * (o + i) for layer in shapes for o, i in layer]
        # uninitialised: a slot is written whole before any row reads it, so on CPU the
        # pages of slots no voice has taken are never touched and cost no resident memory
        flat = torch.empty(sum(sizes), device=device, dtype=dtype)
        parts = iter(flat.split(sizes))
        self.a, self.b = [], []
        for layer in shapes:
            layer_a, layer_b = [], []
            for o, i in layer:
                a, b = next(parts).split([slots * rank * i, slots * rank * o])
                layer_a.append(a.view(slots, rank, i))
                layer_b.append(b.view(slots, o, rank))
                layer_a[-1][0].zero_()  # slot 0: no adapter
                layer_b[-1][0].zero_()
            self.a.append(layer_a)
            self.b.append(layer_b)
        #: adapter key (its folder) -> slot
        self.used: dict[str, int] = {}
        #: every slot ever written (slot 0 too): only these can be in a row's index, even
        #: an idle row's stale one, so only these must hold numbers, never the untouched
        self.written: set[int] = {0}

    @property
    def predictor(self) -> bool:
        """Whether the pool holds the code predictor's layers too."""
        return len(self.shapes) > self.talker_layers

    def free_slot(self) -> int | None:
        taken = set(self.used.values())
        return next((s for s in range(1, self.slots) if s not in taken), None)

    def bytes_per_slot(self) -> int:
        return sum(a[0].numel() * a.element_size() + b[0].numel() * b.element_size()
                   for la, lb in zip(self.a, self.b, strict=True)
                   for a, b in zip(la, lb, strict=True))

    def write(self, slot: int, pairs: Mapping[tuple[int, int], tuple[torch.Tensor, torch.Tensor]],
              scaling: float) -> None:
        """Put one adapter into `slot` (what it does not adapt, and the rank it does not
        fill, stay zero): one pass over the slot's memory."""
        self.written.add(slot)
        for layer, (layer_a, layer_b) in enumerate(zip(self.a, self.b, strict=True)):
            for proj, (a, b) in enumerate(zip(layer_a, layer_b, strict=True)):
                pair = pairs.get((layer, proj))
                if pair is None:
                    a[slot].zero_()
                    b[slot].zero_()
                    continue
                r = pair[0].shape[0]
                a[slot, :r].copy_(pair[0])
                a[slot, r:].zero_()
                b[slot, :, :r].copy_(pair[1]).mul_(scaling)
                b[slot, :, r:].zero_()

    def copy_into(self, other: AdapterPool) -> None:
        """This pool's voices into a larger one (the same layers, maybe the predictor's
        after them, where they adapt nothing; maybe a larger rank, whose rest is zero).
        Only slots this pool wrote are written there (a free one as zeros: an idle row may
        still name it), so the new pool's others stay untouched."""
        r, n = self.rank, len(self.a)
        taken = set(self.used.values())
        for layer, (oa, ob) in enumerate(zip(other.a, other.b, strict=True)):
            for proj, (a2, b2) in enumerate(zip(oa, ob, strict=True)):
                for s in sorted(self.written):
                    if layer < n and s in taken:
                        a2[s, :r].copy_(self.a[layer][proj][s])
                        b2[s, :, :r].copy_(self.b[layer][proj][s])
                        a2[s, r:].zero_()
                        b2[s, :, r:].zero_()
                    else:
                        a2[s].zero_()
                        b2[s].zero_()
        other.used = dict(self.used)
        other.written = set(self.written)


def adapter_pairs(tensors: Mapping[str, Any], layers: int, name: str,
                  predictor_layers: int = 0
                  ) -> tuple[dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]], int]:
    """(layer, projection) -> (A, B) of an adapter voice's tensors, and its rank (code
    predictor layer j is layer `layers` + j); anything the batch cannot apply (another
    module, a full trained tensor) refuses in a sentence."""
    found: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        m = _KEY.match(key)
        predictor = m is not None and m.group(1) != "model"
        if m is None or int(m.group(2)) >= (predictor_layers if predictor else layers):
            raise ModelError(f"The adapter voice {name} changes {key}, which voices sharing "
                             "one base cannot apply.",
                             "Export the run as a full voice (without --adapter).")
        layer = int(m.group(2)) + (layers if predictor else 0)
        proj = PROJECTIONS.index(m.group(3))
        found.setdefault((layer, proj), {})[m.group(4)] = torch.as_tensor(value)
    pairs = {}
    for where, ab in found.items():
        if set(ab) != {"A", "B"}:
            raise ModelError(f"The adapter voice {name} is damaged (an adapter lacks its A or "
                             "B half).", "Export the run again with --adapter.")
        pairs[where] = (ab["A"], ab["B"])
    rank = max((a.shape[0] for a, _b in pairs.values()), default=1)
    return pairs, rank


class Adapters:
    """The pool of one `FastTalker` and the voices in it (thread-safe)."""

    def __init__(self, layers: Any, device: torch.device, dtype: torch.dtype,
                 predictor_layers: Any = ()) -> None:
        def shapes(stack: Any) -> list[list[tuple[int, int]]]:
            return [[tuple(int(n) for n in layer.get_submodule(p).weight.shape)
                     for p in PROJECTIONS] for layer in stack]

        self.shapes = shapes(layers)
        #: the code predictor's layers' (a pool holds them once a voice adapts them)
        self.p_shapes = shapes(predictor_layers)
        self.device, self.dtype = device, dtype
        #: the current pool; None until the first adapter voice (rows then skip the math)
        self.pool: AdapterPool | None = None
        #: slot -> how many hold it (a loaded voice, a request still rendering): a slot is
        #: free for another adapter only once nothing holds it
        self.holds: dict[int, int] = {}
        self._lock = threading.Lock()

    def add(self, key: str, tensors: Mapping[str, Any], scaling: float, name: str) -> int:
        """The slot of adapter `key`, written now unless it is in the pool already; the
        caller holds it (one hold, given back by `release`)."""
        pairs, rank = adapter_pairs(tensors, len(self.shapes), name, len(self.p_shapes))
        every = self.shapes + self.p_shapes
        predictor = any(layer >= len(self.shapes) for layer, _proj in pairs)
        for (layer, proj), (a, b) in pairs.items():
            out, inp = every[layer][proj]
            if tuple(a.shape[1:]) != (inp,) or tuple(b.shape) != (out, a.shape[0]):
                raise ModelError(f"The adapter voice {name} was made for a model of other "
                                 "widths.", "Speak it on the base it was trained on.")
        with self._lock, torch.no_grad():
            pool = self.pool
            if pool is not None and key in pool.used:
                slot = pool.used[key]
                self.holds[slot] = self.holds.get(slot, 0) + 1
                return slot
            fits = pool is not None and rank <= pool.rank and (pool.predictor or not predictor)
            slot = pool.free_slot() if fits and pool is not None else None
            if slot is None:
                pool = self._grown(rank, predictor)
                slot = pool.free_slot()
                assert slot is not None
            pool.write(slot, pairs, scaling)
            pool.used[key] = slot
            self.holds[slot] = self.holds.get(slot, 0) + 1
            self.pool = pool
            return slot

    def _grown(self, rank: int, predictor: bool) -> AdapterPool:
        """A new pool with room for one more voice (and `rank`, and the predictor's layers
        when `predictor` or the old one has them), holding the old one's."""
        old = self.pool
        have = 0 if old is None else len(old.used)
        predictor = predictor or (old is not None and old.predictor)
        bigger = AdapterPool(self.shapes + (self.p_shapes if predictor else []),
                             _slots_for(have + 2), max(rank, 0 if old is None else old.rank),
                             self.device, self.dtype, len(self.shapes))
        if old is not None:
            old.copy_into(bigger)
        return bigger

    def hold(self, slot: int) -> None:
        """One more hold on `slot` (a request that will render with it); 0 holds nothing."""
        if slot:
            with self._lock:
                self.holds[slot] = self.holds.get(slot, 0) + 1

    def release(self, slot: int) -> None:
        """Give back one hold on `slot`; the last one frees it for the next adapter (a row
        still rendering holds its own, so its numbers are never overwritten under it)."""
        if not slot:
            return
        with self._lock:
            left = self.holds.get(slot, 0) - 1
            if left > 0:
                self.holds[slot] = left
                return
            self.holds.pop(slot, None)
            if self.pool is not None:
                self.pool.used = {k: s for k, s in self.pool.used.items() if s != slot}

    def usage(self) -> dict[str, int]:
        """The pool's voice capacity (slot 0 is none) and the slots in use now."""
        pool = self.pool
        return {"adapter_slots": 0 if pool is None else pool.slots - 1,
                "adapter_slots_used": 0 if pool is None else len(set(pool.used.values()))}

    def rows(self, index: torch.Tensor) -> RowAdapters | None:
        """What a frame over rows with adapter slots `index` [B] adds (None: no pool)."""
        pool = self.pool
        return None if pool is None else RowAdapters(pool, index)


class RowAdapters:
    """Each row's adapter for one frame of the talker stack, or (`predictor()`) of the
    code predictor's (see the module doc)."""

    def __init__(self, pool: AdapterPool, index: torch.Tensor, first: int = 0) -> None:
        self.pool = pool
        self.index = index
        self.first = first  # the pool's layer that is this stack's layer 0
        #: (layer, projection) -> the rows' gathered A and B, made on first use
        self._rows: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def predictor(self) -> RowAdapters | None:
        """The same rows' adapters of the code predictor (None: the pool has none)."""
        pool = self.pool
        return RowAdapters(pool, self.index, pool.talker_layers) if pool.predictor else None

    def delta(self, layer: int, proj: int, x: torch.Tensor) -> torch.Tensor:
        """(x A^T) B^T of every row's adapter on `x` [B, T, in]: [B, T, out]."""
        pair = self._rows.get((layer, proj))
        if pair is None:
            at = self.first + layer
            pair = (self.pool.a[at][proj].index_select(0, self.index),  # [B, r, in]
                    self.pool.b[at][proj].index_select(0, self.index))  # [B, out, r]
            self._rows[(layer, proj)] = pair
        a, b = pair
        low = torch.bmm(x.to(a.dtype), a.transpose(1, 2))
        return torch.bmm(low, b.transpose(1, 2)).to(x.dtype)
