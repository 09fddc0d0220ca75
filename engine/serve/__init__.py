"""`voxshard-engine serve`: the cloned voices behind OpenAI's `POST /v1/audio/speech`.

- `voices.discover(targets, workspace)`: the voices offered, by stable names.
- `pool.Pool`: one warm `engine.synth.worker.SpeechWorker` per loaded voice
  (continuous batching across HTTP clients), a bounded admission queue.
- `request.parse_speech`: OpenAI's fields checked; `ApiError` in OpenAI's shape.
- `app.create_app`: the Starlette app (speech, models, voices, health).
- `server.start(ServeSettings)`: safe-default checks, then uvicorn on its own thread
  (a `Serving` handle: `stop`, `wait`; `engine.api.serve` and the CLI start it).
- `wyoming.WyomingService`: Home Assistant's Wyoming protocol on the same pool
  (`serve --wyoming`, beside the HTTP server or alone with `--no-http`).
- `ray_deploy.serve_on_ray(...)`: the same app as a Ray Serve deployment on a cluster
  (`serve --address`).
"""
