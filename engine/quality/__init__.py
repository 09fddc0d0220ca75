"""Is the clone any good? Speaker similarity, evaluation of every checkpoint, the report.

- `similarity`: speaker similarity (resemblyzer, and the model's own encoder);
- `evaluate` + `report`: render held-out sentences from the zero-shot base,
  every checkpoint and the export; measure; write evaluation.json and report.html.

Speech recognition and word error rate live below, in `engine.asr`.
Nothing heavy is imported at package import.
"""
