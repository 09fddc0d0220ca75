"""Is the clone any good? Speaker similarity, evaluation of every checkpoint, the report.

- `similarity`: speaker similarity (resemblyzer, and the model's own encoder);
- `evaluate` + `report`: render held-out sentences from the zero-shot base,
  every checkpoint and the export; measure; write evaluation.json and report.html;
- `compare`: the A/B folder (the same sentences and seed in several checkpoints);
- `render_set`: the render stage both share (which voices, one folder name each, one
  loop that loads each voice once).

Speech recognition and word error rate live below, in `engine.asr`.
Nothing heavy is imported at package import.
"""
