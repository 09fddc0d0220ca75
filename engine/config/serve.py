"""How `voxshard-engine serve` serves voices: the `serve` section of the one config tree.

Validation that needs the network or the disk (the key file, the port) is the
server's (`engine.serve.server.check_settings`); these are the settings as given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.config.schema import SettingError, check, section, setting
from engine.config.speak import DTYPES, QUANT_MODES

#: Home Assistant's usual port for a Wyoming text-to-speech service (Piper's)
WYOMING_PORT = 10200


@section("serve")
@dataclass
class ServeSettings:
    """The speech server on this machine."""

    #: exported voices, voice folders or run folders to serve
    targets: list[str] = field(default_factory=list)
    #: also serve every voice of this folder (each voice, its exports and its trained runs)
    workspace: str | None = setting(None, label="Workspace")
    #: address to listen on; any but loopback needs an API key
    host: str = setting("127.0.0.1", label="Listen on")
    #: TCP port (0: any free one)
    port: int = setting(8000, label="Port", at_least=0, at_most=65535)
    #: file holding the key clients send as 'Authorization: Bearer KEY' (required off loopback)
    api_key_file: str | None = setting(None, label="Require a key")
    #: chunks generated together across requests
    rows: int = setting(8, at_least=1)
    #: cpu, cuda, cuda:1 ... (None: a GPU if there is one)
    device: str | None = None
    #: weight precision of the loaded voices
    dtype: str = setting("auto", choices=DTYPES)
    #: faster CPU option that changes the numbers: int8 or fp16 weights
    quantize: str | None = setting(None, choices=QUANT_MODES)
    #: faster CPU option: fused q/k/v and gate/up projections
    fuse: bool = False
    #: voices kept loaded at once
    max_loaded: int = setting(2, at_least=1)
    #: requests admitted at once; more get 429 with Retry-After
    queue: int = setting(32, at_least=1)
    #: seconds a request may take before it is cancelled
    timeout_s: float = setting(300.0, unit="s", flag="--timeout", above=0)
    #: longest input text in characters (as OpenAI's endpoint)
    max_input: int = setting(4096, at_least=1)
    #: largest request body in bytes
    max_body: int = setting(1 << 20, at_least=1024)
    #: load the first voice at start (not on its first request)
    preload: bool = True
    #: a Base model: requests may then clone from their own `reference_audio` on it
    reference_base: str | None = setting(None, label="Reference base model")
    #: also speak to Home Assistant through the Wyoming protocol at this address, e.g.
    #: tcp://127.0.0.1:10200 (port 0: any free one)
    wyoming: str | None = setting(None, label="Home Assistant")
    #: let other computers reach the Wyoming address: the protocol has no keys, so anyone
    #: who can reach it may use every voice served
    wyoming_allow_lan: bool = setting(False, label="Home Assistant on other computers")
    #: announce the Wyoming service on the local network (mDNS, _wyoming._tcp.local.) so
    #: Home Assistant finds it by itself and offers it under Settings > Devices & services
    zeroconf: bool = setting(False, label="Announce it on the network")
    #: serve OpenAI's HTTP endpoint (--no-http with --wyoming: Wyoming alone)
    http: bool = setting(True, label="OpenAI's HTTP endpoint")

    def __post_init__(self) -> None:
        try:
            check(self)  # each field's bounds, from its `setting`
        except SettingError as exc:  # the setting as data: each surface names it its way
            raise exc.as_input() from exc


@section("cluster_serve")
@dataclass
class ClusterServeSettings:
    """The same server as a Ray Serve deployment on an existing cluster (`--address`)."""

    #: the Ray cluster: what `ray start --head` printed, or "auto"
    address: str
    #: fixed replica count (None: one per GPU, else 1)
    replicas: int | None = setting(None, label="Replicas")
    #: let Ray Serve scale the replicas, at least this many (None with max_replicas: fixed)
    min_replicas: int | None = setting(None, label="Fewest replicas")
    #: let Ray Serve scale the replicas, at most this many
    max_replicas: int | None = setting(None, label="Most replicas")
    #: CPUs each replica asks for
    replica_cpus: float = 1.0


#: the settings `serve` takes as flags besides its voices (their words, type, bounds and
#: default from the field), and those of them the window's Serve page shows as fields
SERVE_SETTINGS: tuple[str, ...] = (
    "serve.workspace", "serve.host", "serve.port", "serve.api_key_file", "serve.rows",
    "serve.queue", "serve.timeout_s", "serve.max_input", "serve.max_body", "serve.max_loaded",
    "serve.preload", "serve.reference_base", "serve.wyoming", "serve.wyoming_allow_lan",
    "serve.zeroconf", "serve.http", "serve.device", "serve.dtype", "serve.quantize",
    "serve.fuse",
)
