"""Speech synthesis: speak any text in a cloned voice, fast.

Engine API (the CLI and the GUI's worker process use the same calls):

- `voice.resolve_source(target, checkpoint=, reference=, reference_text=,
  speaker=, base=)` -> `VoiceSource`: an exported voice, a run checkpoint
  (built in memory from the base model, no export), or a zero-shot preview
  (base + reference clip: in-context cloning when the clip's transcript is
  given or known, else its x-vector).
- `synthesizer.Synthesizer.load(source, device=, dtype=)`, then
  `.speak(text, SpeakOptions, on_event, cancel)` -> `Speech` (audio, seed,
  per-chunk info, real-time factor), `.speak_to_file(text, out, ...)`,
  `.speak_many(texts, ...)`, `.use_source(other)` (swap checkpoints in place),
  `.speak_stream(text, sink)` (audio to a `stream` sink as it is generated:
  `GrowingFile`, `RawPcm`, `Player`).
- the A/B folder of several checkpoints (`compare`) renders through this package
  from `engine.quality` (`quality.compare`, `quality.render_set`).
- `worker.SpeechWorker` / `worker.serve`: a warm worker speaking JSON lines
  (`voxshard-engine --json serve-speech`), requests batched continuously
  (`batcher.ContinuousBatcher` over `rows.RowBatch`).
- `engine.config.speak.SpeakOptions` and `engine.text.split_text` are torch-free
  (safe for the GUI).

Speed comes from `decoding.FastTalker`, our frame loop over the official
modules (greedy output identical to the official `generate`), its static,
CUDA-graph-ready frame (`rows.RowBatch`), and on CPUs the optional int8 and
fused projections (`quant`).
"""
