"""Reading a `POST /v1/audio/speech` body: OpenAI's fields, checked, or an `ApiError`.

Every bad input becomes OpenAI's error shape with the status a client expects
(400 bad field, 404 unknown model or voice, 413 too large), never a traceback.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass, field
from typing import Any

from engine.config.schema import SettingError, path_of, rules, value_problem, value_type
from engine.config.speak import MAX_INSTRUCT, SpeakOptions

#: the model names a client may send; OpenAI's own names are accepted so that
#: programs with a fixed model list work unchanged
MODELS = ("voxshard", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")
STREAM_FORMATS = ("audio", "sse")
#: speak settings that OpenAI's own fields carry, by OpenAI's name
OPENAI_CARRIES = {"instructions": "instruct"}
#: optional fields beyond OpenAI's: every speak setting its schema lets clients send
#: (`setting(..., http=False)` keeps one on the server), by its field name
EXTENSION_OPTIONS = tuple(name for name, rule in rules(SpeakOptions).items()
                          if rule.http and name not in OPENAI_CARRIES.values())
#: every field a request may hold; any other is refused by name
KNOWN_FIELDS = ("model", "input", "voice", "response_format", "speed", "instructions",
                "stream_format", "reference_audio", "reference_text", *EXTENSION_OPTIONS)


class ApiError(Exception):
    """An answer in OpenAI's error shape."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code, self.kind, self.headers = code, kind, headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


@dataclass
class SpeechRequest:
    model: str
    text: str
    voice: str
    response_format: str
    speed: float
    stream_format: str | None
    instructions: str | None
    options: dict[str, Any] = field(default_factory=dict)
    reference_audio: bytes | None = None
    reference_text: str | None = None


def _string(body: dict[str, Any], name: str, default: str | None = None,
            required: bool = False) -> str | None:
    value = body.get(name, default)
    if value is None:
        if required:
            raise ApiError(400, f"The field '{name}' is required.", param=name,
                           code="missing_field")
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"The field '{name}' must be a string.", param=name,
                       code="invalid_type")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"The field '{name}' holds invalid Unicode (a lone surrogate).",
                       param=name, code="invalid_value") from None
    return value


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, f"The field '{name}' must be a number.", param=name,
                       code="invalid_type")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or not low <= number <= high:
        raise ApiError(400, f"The field '{name}' must be between {low} and {high}.",
                       param=name, code="invalid_value")
    return number


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # bad JSON, bad UTF-8, 5000-digit numbers, deep nesting
        raise ApiError(400, "The request body is not valid JSON.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    return body


def _extension(body: dict[str, Any], name: str) -> Any:
    """Speak setting `name` as sent, checked against its schema: a wrong kind of value is
    `invalid_type`, one out of its bounds `invalid_value` in the schema's words."""
    value = body[name]
    if value_type(SpeakOptions, name) is str:
        return _string(body, name)
    path, rule = path_of(SpeakOptions, name), rules(SpeakOptions)[name]
    if isinstance(value, float) and not math.isfinite(value):  # JSON's NaN and Infinity
        why = rule.problem(value)
    else:
        why = value_problem(path, value)
    if why is None:
        return value
    message = SettingError(path, why).as_input().message  # "top_p must be ..., not 2."
    if len(message) > 240:  # a huge value sent: not echoed whole
        message = message[:236] + "..."
    raise ApiError(400, message, param=name,
                   code="invalid_value" if rule.problem(value) else "invalid_type")


def _unknown_field(name: str) -> ApiError:
    """The refusal of a field this endpoint does not take, saying what to send instead."""
    carrier = next((k for k, v in OPENAI_CARRIES.items() if v == name), None)
    if carrier:
        why = f"send it as '{carrier}'"
    elif name in rules(SpeakOptions):
        why = "it is this server's own setting"
    else:
        why = f"this endpoint takes {', '.join(KNOWN_FIELDS)}"
    return ApiError(400, f"Unknown parameter: '{name}'; {why}.", param=name,
                    code="unknown_parameter")


def parse_speech(raw: bytes, *, voices: set[str] | dict[str, Any], formats: tuple[str, ...],
                 max_input: int, allow_reference: bool) -> SpeechRequest:
    body = parse_json(raw)
    unknown = next((name[:80] for name in body if name not in KNOWN_FIELDS), None)
    if unknown is not None:
        raise _unknown_field(unknown)
    model = _string(body, "model", "voxshard") or "voxshard"
    if model not in MODELS:
        raise ApiError(404, f"The model '{model[:80]}' does not exist here; use one of: "
                       f"{', '.join(MODELS)}.", param="model", code="model_not_found")
    text = _string(body, "input", required=True) or ""
    if not text.strip():
        raise ApiError(400, "The input text is empty.", param="input", code="empty_input")
    if len(text) > max_input:
        raise ApiError(413, f"The input is {len(text)} characters; the limit is {max_input}.",
                       param="input", code="input_too_long")
    reference_audio = reference_text = None
    if "reference_audio" in body or "reference_text" in body:
        if not allow_reference:
            raise ApiError(400, "Cloning from a reference clip is not enabled on this server.",
                           param="reference_audio", code="reference_not_allowed")
        encoded = _string(body, "reference_audio", required=True) or ""
        try:
            reference_audio = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "reference_audio must be base64 of a WAV, FLAC or OGG file.",
                           param="reference_audio", code="invalid_value") from None
        reference_text = _string(body, "reference_text")
    voice = _string(body, "voice", required=not reference_audio)
    if voice is not None and voice not in voices and not reference_audio:
        known = ", ".join(sorted(voices)[:20])
        raise ApiError(404, f"The voice '{voice[:80]}' is not served here; available: {known}.",
                       param="voice", code="voice_not_found")
    fmt = _string(body, "response_format", "mp3") or "mp3"
    if fmt not in formats:
        raise ApiError(400, f"The response_format '{fmt[:40]}' is not available here; use one "
                       f"of: {', '.join(formats)}.", param="response_format",
                       code="unsupported_format")
    stream_format = _string(body, "stream_format")
    if stream_format is not None and stream_format not in STREAM_FORMATS:
        raise ApiError(400, f"The stream_format '{stream_format[:40]}' is not supported; use "
                       "audio or sse.", param="stream_format", code="invalid_value")
    speed = _number(body, "speed", 1.0, 0.25, 4.0)
    if speed != 1.0 and stream_format is not None:
        raise ApiError(400, "A speed other than 1.0 cannot be honoured while streaming; "
                       "leave out stream_format or the speed.", param="speed",
                       code="invalid_value")
    instructions = _string(body, "instructions")
    if instructions is not None and len(instructions) > MAX_INSTRUCT:
        raise ApiError(400, f"instructions must be at most {MAX_INSTRUCT} characters.",
                       param="instructions", code="invalid_value")
    options = {name: _extension(body, name) for name in EXTENSION_OPTIONS
               if body.get(name) is not None}  # null: the setting's default
    if instructions:
        options["instruct"] = instructions
    if reference_audio:
        voice = "(reference)"  # the clip is the voice; a name sent beside it is not used
    return SpeechRequest(model=model, text=text, voice=voice or "", response_format=fmt,
                         speed=speed, stream_format=stream_format, instructions=instructions,
                         options=options, reference_audio=reference_audio,
                         reference_text=reference_text)
