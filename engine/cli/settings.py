"""CLI flags made from the config dataclasses: a setting's type, default and help live once.

A field documented in `engine/config/` with a `#:` comment above it becomes a
flag whose help is that comment and whose "(default ...)" is the field's own
default, so the command line can never repeat a default that has since changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable
from typing import Any

_FIELD = re.compile(r"(\w+)\s*:")
#: `add_field(..., default=FIELD)`: argparse's default is the field's own (the value is
#: always set, for settings built straight from the parsed flags)
FIELD: Any = object()


@functools.cache
def field_help(cls: type) -> dict[str, str]:
    """The `#:` comment right above each field of dataclass `cls`, joined into one line."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # a frozen app without its sources: flags keep their own help
        return {}
    docs: dict[str, str] = {}
    pending: list[str] = []
    lines = source.splitlines()
    body = next(i for i, line in enumerate(lines) if line.startswith("class ")) + 1
    for line in lines[body:]:
        text = line.strip()
        if text.startswith("#:"):
            pending.append(text[2:].strip())
            continue
        if line[:1] not in (" ", "\t") and text:  # left the class body
            break
        if text.startswith(("def ", "@")):
            break
        match = _FIELD.match(text)
        if match and pending:
            docs[match.group(1)] = " ".join(pending)
        pending = []
    return docs


def _field(cls: type, name: str) -> dataclasses.Field[Any]:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def field_default(cls: type, name: str) -> Any:
    f = _field(cls, name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _value_type(cls: type, name: str) -> Any:
    """The field's type without `None` (`int | None` -> int)."""
    hint = typing.get_type_hints(cls)[name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else str
    return hint


def _shown(value: Any) -> str:
    if isinstance(value, float) and value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return str(value)


def add_field(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
              name: str, *, flag: str | None = None, help: str | None = None,
              default: Any = None, show_default: bool = True,
              type: Callable[[str], Any] | None = None, **kwargs: Any) -> argparse.Action:
    """Add `--flag` for field `name` of `cls`.

    `default` is argparse's own (None by default: "not given", so the engine or
    the voice's saved settings decide); the help shows the field's default.
    A bool field is an on/off switch.
    """
    flag = flag or "--" + name.replace("_", "-")
    text = help or field_help(cls).get(name) or name.replace("_", " ")
    shown = field_default(cls, name)
    if show_default and shown is not None and not isinstance(shown, bool):
        text = f"{text} (default {_shown(shown)})"
    text = text.replace("%", "%%")  # argparse formats help with %
    kind = _value_type(cls, name)
    kwargs.setdefault("dest", name)
    if default is FIELD:
        default = shown
    if kind is bool:
        kwargs.setdefault("action", argparse.BooleanOptionalAction)
        return parser.add_argument(flag, default=default, help=text, **kwargs)
    converter = type or (kind if kind in (int, float, str) else str)
    return parser.add_argument(flag, type=converter, default=default, help=text, **kwargs)
