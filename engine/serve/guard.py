"""What every request passes before any route runs (plain ASGI middleware).

- With a key: `Authorization: Bearer KEY`, compared in constant time.
- A body whose Content-Length is over the limit: 413 before it is read.
- Without a key, the server trusts whoever can reach it, which on loopback
  means programs of this computer, not web pages: a page open in a browser
  can still send requests to 127.0.0.1. So a request must name this computer
  as its host (a DNS-rebinding page names its own domain) and may come from
  no other web origin (the browser says which page sent it). Programs such
  as curl, the `openai` client, Open WebUI's or SillyTavern's server send no
  Origin and are unaffected.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.serve.request import ApiError

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _hostname(value: str) -> str:
    """The host part of a Host header or an origin URL, without port or brackets."""
    netloc = urlsplit(value if "//" in value else f"//{value}").hostname
    return (netloc or "").lower()


def _is_loopback_name(name: str) -> bool:
    return name in LOOPBACK_NAMES or name.startswith("127.")


class Guard:
    def __init__(self, app: ASGIApp, key: str | None, max_body: int,
                 loopback: bool = True) -> None:
        self.app = app
        self.key = None if key is None else f"Bearer {key}".encode()
        self.max_body = max_body
        #: bound to loopback: only this computer's names are accepted as Host
        self.loopback = loopback

    def _refusal(self, headers: dict[bytes, bytes]) -> ApiError | None:
        if self.key is not None:
            given = headers.get(b"authorization", b"")
            # constant time: the comparison says nothing about how much of the key matched
            if not hmac.compare_digest(given, self.key):
                return ApiError(401, "Incorrect or missing API key; send "
                                "'Authorization: Bearer KEY'.", code="invalid_api_key")
        else:
            host = headers.get(b"host", b"").decode("latin-1")
            if self.loopback and not _is_loopback_name(_hostname(host)):
                return ApiError(403, "This server answers only requests addressed to this "
                                "computer (127.0.0.1 or localhost).", code="forbidden_host")
            origin = headers.get(b"origin")
            if origin is not None and not _is_loopback_name(
                    _hostname(origin.decode("latin-1"))):
                return ApiError(403, "Requests from web pages are refused; call the server "
                                "from a program, or start it with a key (api_key_file).",
                                code="forbidden_origin")
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_body
            except ValueError:
                too_big = True
            if too_big:
                return ApiError(413, f"The request body is over the limit of {self.max_body} "
                                "bytes.", code="body_too_large")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(dict(scope.get("headers") or []))
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)
