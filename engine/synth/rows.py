"""Fixed-shape decoding of a batch of rows, each at its own position.

`RowBatch` holds every buffer one codec frame reads and writes (KV caches,
current token, write slot, frames made, text still to feed, noise keys) for `B`
rows. `frame(span)` advances all rows by one frame with:
- no host synchronisation and no tensor made from a Python value (checked on
  the CPU by tests/test_synth_graphs.py with a torch dispatch mode), so it
  can be captured as a CUDA graph and replayed;
- per-row write positions (a scatter into the cache, never indexed
  assignment of a host scalar), so a finished row can be refilled with the
  next request while the others keep going (continuous batching,
  engine/synth/batcher.py);
- attention over the first `span` cache slots only, with grouped-query
  attention reading the shared K/V heads, never a copy. Spans are fixed
  buckets (64, 128, 256 ... the capacity): a few graphs per batch shape.

CUDA graphs (`run`), following PyTorch's recipe: the first frame of a span
runs on the capture stream (warm-up: lazy allocations, library handles), the
second is captured there into a memory pool shared by every graph of the
model, then replayed. A capture that fails is remembered per span (that span
runs eagerly from then on: no retry every frame, one warning), and
`graph_status` reports the true state over all spans: "captured", "partial"
(some spans failed), "failed", or "off". `prepare` captures every span
before the first request (at load).

Only the structure of the sampling settings is fixed per batch (part of the
cache key, `settings_key`: sampling on/off, top-k, whether end-of-speech may
end a row). Temperatures, top-p, the repetition penalty and min_new_tokens
are per-row device tensors (`load_rows`), read by the captured frame as
data: requests that differ only in those share rows and graphs. So is each
row's adapter voice (`adapter`: its slot in the model's adapter pool, `adapters`). Sampling
noise is computed inside the frame from each row's key (seed + chunk index)
and its frame counter (`sampling.FrameNoise`): nothing is drawn on the host
or copied in per frame, and a row's noise never depends on its batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from engine.synth.capture import CAPTURE_ERROR_MODE, GATE
from engine.synth.quant import linear
from engine.synth.sampling import FrameNoise, RowSampler, SamplerSettings, choose

log = logging.getLogger(__name__)

#: attention spans (and captured graphs) grow in steps of this many cache slots
SPAN_STEP = 64
PREDICTOR_POSITIONS = 16


class RowBatch:
    """Device state of `batch` rows for one model and one set of decode settings."""

    def __init__(self, fast: Any, batch: int, capacity: int, trail: int, limit: int,
                 settings: Any, width: int) -> None:
        self.fast = fast
        self.batch = batch
        self.capacity = capacity
        self.limit = limit
        self.settings = settings
        self.width = width
        dev, dtype = fast.device, fast.dtype
        hidden = fast.cfg.hidden_size
        like = torch.zeros(1, device=dev, dtype=dtype)
        self.t_cache = fast.t_stack.alloc(batch, capacity, like)
        self.p_cache = fast.p_stack.alloc(batch, PREDICTOR_POSITIONS, like)
        self.cos, self.sin = fast._talker_rope(capacity)
        self.token = torch.zeros(batch, dtype=torch.long, device=dev)
        self.past_hidden = torch.zeros(batch, 1, hidden, dtype=dtype, device=dev)
        self.seen = torch.zeros(batch, fast.vocab, dtype=torch.bool, device=dev)
        self.key_valid = torch.zeros(batch, capacity, dtype=torch.bool, device=dev)
        self.slot = torch.zeros(batch, dtype=torch.long, device=dev)  # next cache write
        self.base = torch.zeros(batch, dtype=torch.long, device=dev)  # rotary offset (padding)
        self.step = torch.zeros(batch, dtype=torch.long, device=dev)  # frames made
        self.trail_cap = trail
        self.trailing = torch.zeros(batch, trail + 1, hidden, dtype=dtype, device=dev)
        self.codes = torch.zeros(batch, limit, fast.groups, dtype=torch.long, device=dev)
        # noise keys (seed + chunk index) per row; the frame counter is `step`
        self.keys = torch.zeros(batch, dtype=torch.long, device=dev)
        self.frame_noise = FrameNoise(fast.groups, width, dev)
        self.sampled = settings.talker.do_sample or settings.predictor.do_sample
        # per-row sampling values (data of the captured frame, not part of its shape)
        ones = [torch.ones(batch, 1, device=dev) for _ in range(4)]
        self.t_sampler = RowSampler(settings.talker.do_sample, settings.talker.top_k, *ones[:2])
        self.p_sampler = RowSampler(settings.predictor.do_sample, settings.predictor.top_k,
                                    *ones[2:])
        self.penalty = torch.ones(batch, 1, device=dev)
        self.min_new = torch.zeros(batch, dtype=torch.long, device=dev)
        self.set_values(slice(None), settings)
        # each row's adapter voice: its slot in the model's adapter pool (0: none), frame data
        self.adapter = torch.zeros(batch, dtype=torch.long, device=dev)
        #: the adapter pool the captured graphs read (another one: they are dropped)
        self._pool: Any = fast.adapters.pool
        # constant index tensors, made once (not inside the captured frame)
        self.frame_index = torch.arange(fast.groups, device=dev).view(1, 1, -1)
        p_slots = torch.arange(PREDICTOR_POSITIONS, device=dev)
        # predictor: slot j may see slots <= j (stale slots of the last frame are hidden)
        self.p_masks = [(p_slots[None] <= p_slots[:2, None])[None, None]]
        self.p_masks += [(p_slots <= j)[None, None, None]
                         for j in range(2, PREDICTOR_POSITIONS)]
        self.graphs: dict[int, Any] = {}
        #: spans whose capture failed: they run eagerly, never captured again
        self.failed: set[int] = set()
        self.capture_attempts = 0
        self._warm: set[int] = set()
        self._side: Any = None  # the capture stream (CUDA)

    # -- filling rows ------------------------------------------------------------------------
    def set_values(self, rows: slice | list[int], settings: Any) -> None:
        """The sampling values of `rows` (their structure must be this batch's)."""
        if settings_key(settings) != settings_key(self.settings):
            raise ValueError("these settings need another batch (sampling, top-k or "
                             "end-of-speech differ)")
        self.t_sampler.temperature[rows] = settings.talker.temperature
        self.t_sampler.top_p[rows] = settings.talker.top_p
        self.p_sampler.temperature[rows] = settings.predictor.temperature
        self.p_sampler.top_p[rows] = settings.predictor.top_p
        self.penalty[rows] = settings.repetition_penalty
        self.min_new[rows] = settings.min_new_tokens

    def load_rows(self, rows: slice | list[int], token: torch.Tensor, hidden: torch.Tensor,  # noqa: PLR0913
                  valid: torch.Tensor, base: torch.Tensor, trailing: torch.Tensor,
                  tts_pad: torch.Tensor, settings: Any = None,
                  keys: torch.Tensor | None = None,
                  adapter: torch.Tensor | int = 0) -> None:
        """Start `rows` after their prefill (its K/V already in the caches at slots
        [0, T)): first token, last hidden state, which slots hold real tokens, and
        (when given) their own sampling values, noise keys (`row_keys`) and adapter
        voice slots (`adapters.Adapters`; 0: the base alone)."""
        if settings is not None:
            self.set_values(rows, settings)
        if keys is not None:
            self.keys[rows] = keys
        self.adapter[rows] = adapter
        t0 = valid.shape[1]
        self.token[rows] = token
        self.past_hidden[rows] = hidden
        self.seen[rows] = False
        self.key_valid[rows] = False
        self.key_valid[rows, :t0] = valid
        self.slot[rows] = t0
        self.base[rows] = base
        self.step[rows] = 0
        self.codes[rows] = 0
        width = min(trailing.shape[1], self.trail_cap)
        self.trailing[rows] = tts_pad.to(self.trailing.dtype).view(1, 1, -1)
        self.trailing[rows, :width] = trailing[:, :width].to(self.trailing.dtype)

    def span_for(self, longest: int) -> int:
        """The attention span covering slot `longest`: the smallest of the fixed
        buckets SPAN_STEP x 2^k, or the whole cache."""
        span = SPAN_STEP
        while span < longest + 1 and span < self.capacity:
            span *= 2
        return min(self.capacity, span)

    def spans(self) -> list[int]:
        """Every bucket a frame of this batch can use."""
        out = [SPAN_STEP]
        while out[-1] < self.capacity:
            out.append(min(self.capacity, out[-1] * 2))
        return out

    @property
    def graph_status(self) -> str:
        if self.failed:
            return "partial" if self.graphs else "failed"
        return "captured" if self.graphs else "off"

    # -- one frame ---------------------------------------------------------------------------
    def frame(self, span: int) -> None:
        """Advance every row by one codec frame (capturable: see the module doc)."""
        fast = self.fast
        settings = self.settings
        token = self.token
        self.seen.scatter_(1, token[:, None], True)
        p_noise = t_noise = None
        if self.sampled:
            # this frame's codebooks 1..15, then codebook 0 of the next frame
            p_noise = self.frame_noise.draw(self.keys, self.step, first=1)
            t_noise = self.frame_noise.draw(self.keys, self.step + 1, count=1)[:, 0]
        lora = fast.adapters.rows(self.adapter)
        made, summed = fast.predict_codebooks(
            self.past_hidden, token, self.p_cache,
            lambda j, logits: choose(logits, self.p_sampler,
                                     None if p_noise is None else p_noise[:, j]),
            masks=self.p_masks, lora=None if lora is None else lora.predictor())
        at = self.step.clamp(max=self.limit - 1).view(-1, 1, 1).expand(-1, 1, fast.groups)
        self.codes.scatter_(1, at, made[:, None])  # [B, 1, 16]
        text_at = self.step.clamp(max=self.trail_cap).view(-1, 1, 1)
        text = self.trailing.gather(1, text_at.expand(-1, 1, self.trailing.shape[2]))
        write = self.slot.clamp(max=self.capacity - 1)
        pos = (write - self.base)[:, None]
        self.key_valid.scatter_(1, write[:, None], True)
        hidden = fast.t_stack.forward(summed + text, self.cos[pos], self.sin[pos], self.t_cache,
                                      0, self.key_valid[:, None, None, :span], rows=write,
                                      span=span, lora=lora)
        scores = linear(hidden, fast.head)[:, -1].to(torch.float32)
        # per-row penalty (x * 1 and x / 1 are exact: a row without one is unchanged)
        penalty = self.penalty
        penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
        scores = torch.where(self.seen, penalised, scores)
        # frames made so far = step + 1; end-of-speech banned below min_new_tokens
        ban = (self.step + 1) < self.min_new
        if not settings.stop_at_eos:
            ban = ban | True
        eos = fast.eos
        scores[:, eos] = scores[:, eos].masked_fill(ban, float("-inf"))
        scores = scores.masked_fill(fast.suppress, float("-inf"))
        self.token.copy_(choose(scores, self.t_sampler, t_noise))
        self.past_hidden.copy_(hidden)
        self.slot.add_(1)
        self.step.add_(1)

    def run(self, span: int, graphs: bool) -> None:
        """One frame: replay the graph of this span (captured on its second use, after
        one warm-up frame on the capture stream), or run it eagerly."""
        if not graphs or span in self.failed:
            self.frame(span)
            return
        if self.fast.adapters.pool is not self._pool:
            # the pool grew (or was made): graphs read the old tensors, capture again
            self.graphs.clear()
            self._warm.clear()
            self._pool = self.fast.adapters.pool
        graph = self.graphs.get(span)
        if graph is not None:
            graph.replay()
            return
        if span not in self._warm:
            self._warm.add(span)
            self._on_side(lambda: self.frame(span))
            return
        if self._capture(span):
            # the capture recorded the frame without running it
            self.graphs[span].replay()
        else:
            self.frame(span)

    def prepare(self, graphs: bool) -> None:
        """Capture every span now (at load), so no request pays a capture. The
        frames run on idle rows (each attends to slot 0: no NaN) and the rows'
        state is cleared after; every request loads its rows anyway."""
        if not graphs:
            return
        self.key_valid[:, 0] = True
        for span in self.spans():
            if span not in self.graphs and span not in self.failed:
                self.run(span, True)  # warm-up
                self.run(span, True)  # capture and replay
        self.slot.zero_()
        self.step.zero_()
        self.codes.zero_()

    def _on_side(self, work: Callable[[], None]) -> None:
        """Run `work` on the capture stream, ordered with the current stream."""
        if self.fast.device.type != "cuda":
            work()
            return
        if self._side is None:
            self._side = torch.cuda.Stream(device=self.fast.device)
        current = torch.cuda.current_stream(self.fast.device)
        self._side.wait_stream(current)
        with torch.cuda.stream(self._side):
            work()
        current.wait_stream(self._side)

    def _capture(self, span: int) -> bool:
        self.capture_attempts += 1
        try:
            with GATE.capture():  # alone on the GPU: no other thread's work breaks it
                self.graphs[span] = self._record(lambda: self.frame(span))
            return True
        except RuntimeError as exc:
            # capture is an optimisation: this span runs eagerly from now on (never
            # retried: each try costs a synchronize and an empty_cache), said once
            self.failed.add(span)
            log.warning("CUDA graph capture failed for attention span %d; its frames run "
                        "eagerly: %s", span, exc)
            return False

    def _record(self, frame: Callable[[], None]) -> Any:
        """Capture `frame` on the capture stream into the model's shared graph pool."""
        if self._side is None:
            self._side = torch.cuda.Stream(device=self.fast.device)
        pool = getattr(self.fast, "graph_pool", None)
        if pool is None:
            pool = self.fast.graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=self._side,
                              capture_error_mode=CAPTURE_ERROR_MODE):
            frame()
        return graph


def bucket(n: int, smallest: int) -> int:
    """The fixed size for `n`: `smallest` x 2^k (shapes, and so graphs, are shared)."""
    size = smallest
    while size < n:
        size *= 2
    return size


def settings_key(settings: Any) -> tuple[Any, ...]:
    """What fixes a batch's frame (its shapes and branches); the other settings are
    per-row values (`RowBatch.set_values`)."""
    def one(s: SamplerSettings) -> tuple[Any, ...]:
        return (s.do_sample, s.top_k if s.do_sample else 0)

    return (one(settings.talker), one(settings.predictor), settings.stop_at_eos)
