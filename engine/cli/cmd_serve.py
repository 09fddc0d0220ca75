"""CLI: `serve` (the OpenAI-compatible speech endpoint, engine/serve)."""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli.main import add_command
from engine.config.speak import QUANT_MODES
from engine.core.events import Emitter


def _serve(args: argparse.Namespace, emitter: Emitter) -> dict[str, Any]:
    from engine.core.storage import expand_arg
    from engine.serve.server import ServeSettings, serve

    settings = ServeSettings(
        targets=list(args.voices or []), workspace=args.workspace, host=args.host,
        port=args.port, api_key_file=args.api_key_file, rows=args.rows, device=args.device,
        dtype=args.dtype, quantize=args.quantize, fuse=args.fuse, max_loaded=args.max_loaded,
        queue=args.queue, timeout_s=args.timeout, max_input=args.max_input,
        max_body=args.max_body, preload=not args.no_preload,
        reference_base=expand_arg(args.reference_base) if args.reference_base else None)
    if args.address:
        from engine.serve.ray_deploy import ClusterServeSettings, serve_on_ray

        cluster = ClusterServeSettings(
            address=args.address, replicas=args.replicas, min_replicas=args.min_replicas,
            max_replicas=args.max_replicas, replica_cpus=args.replica_cpus)
        return serve_on_ray(settings, cluster, emitter)
    return serve(settings, emitter)


def register(sub: Any) -> None:
    p = add_command(sub, "serve", _serve,
                    "serve voices to other programs through OpenAI's /v1/audio/speech")
    p.add_argument("voices", nargs="*", metavar="VOICE_OR_EXPORT",
                   help="exported voices, voice folders or run folders to serve")
    p.add_argument("--workspace", help="also serve every voice of this folder "
                   "(each voice, its exports and its trained runs)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other needs a key)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0: any free)")
    p.add_argument("--api-key-file", help="file holding the key clients send as "
                   "'Authorization: Bearer KEY' (required off loopback)")
    p.add_argument("--rows", type=int, default=8,
                   help="chunks generated together across requests (default 8)")
    p.add_argument("--queue", type=int, default=32,
                   help="requests admitted at once; more get 429 with Retry-After (default 32)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a request may take before it is cancelled (default 300)")
    p.add_argument("--max-input", type=int, default=4096,
                   help="longest input text in characters (default 4096, as OpenAI)")
    p.add_argument("--max-body", type=int, default=1 << 20,
                   help="largest request body in bytes (default 1 MiB)")
    p.add_argument("--max-loaded", type=int, default=2,
                   help="voices kept loaded at once (default 2)")
    p.add_argument("--no-preload", action="store_true",
                   help="load the first voice on its first request, not at start")
    p.add_argument("--reference-base", metavar="BASE_MODEL",
                   help="allow requests to clone from their own reference_audio (base64) on "
                   "this Base model (off by default)")
    p.add_argument("--address", metavar="HOST:PORT",
                   help="serve on this existing Ray cluster through Ray Serve (what `ray start "
                   "--head` printed, or 'auto'); the voice folders must be visible at the same "
                   "path on every node. Needs voxshard[ray-serve]")
    p.add_argument("--replicas", type=int,
                   help="with --address: this many replicas (default: one per GPU, else 1)")
    p.add_argument("--min-replicas", type=int,
                   help="with --address: let Ray Serve scale replicas, at least this many")
    p.add_argument("--max-replicas", type=int,
                   help="with --address: let Ray Serve scale replicas, at most this many")
    p.add_argument("--replica-cpus", type=float, default=1.0,
                   help="with --address: CPUs each replica asks for (default 1)")
    p.add_argument("--device")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    p.add_argument("--quantize", choices=QUANT_MODES,
                   help="faster CPU option (changes the numbers): int8 or fp16 weights")
    p.add_argument("--fuse", action="store_true", help="faster CPU option (fused projections)")
