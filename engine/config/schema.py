"""The settings schema: each config field's words, bounds, unit and choices, kept once.

A field declared with `setting(...)` carries a `Setting` as its metadata; its help is
the `#:` comment above it (`field_help`). From these the CLI makes its flags
(`engine.cli.settings`), the window its form fields and their flags, and every config
class its validation (`check`), so a rule such as 0 < F <= 1 is written in one place.

A setting is named across surfaces by its path, "section.field" ("model.predictor_frames");
an error that names one writes "{model.predictor_frames}" in its text, and each surface
words it: the CLI as the flag it has for it (`engine.cli.main.cli_words`), the window
as the field's label, the Python API as the keyword (`engine.core.errors`).

Light: no torch; the window imports it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import re
import textwrap
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from engine.core.errors import InputError

#: section name -> config class, filled by `section`
SECTIONS: dict[str, type] = {}

_FIELD = re.compile(r"(\w+)\s*:")


@dataclass(frozen=True)
class Setting:
    """What the surfaces know of one field besides its type, default and help."""

    #: the window's words for the field (its form label)
    label: str = ""
    #: shown after the value ("min", "dB", "s")
    unit: str = ""
    #: the lowest value allowed, and whether it is allowed itself
    low: float | None = None
    low_open: bool = False
    #: the highest value allowed, and whether it is allowed itself
    high: float | None = None
    high_open: bool = False
    #: the values allowed (a text setting)
    choices: tuple[str, ...] = ()
    #: the CLI's flag when it is not --field-name
    flag: str = ""
    #: whether a client of the speech server may send it (False: the server's own, such as
    #: a path on its disk or a resource its operator sizes)
    http: bool = True

    def rule(self) -> str:
        """The bounds in words: "above 0 and at most 1", "at least 1", "one of a, b"."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        parts = []
        if self.low is not None:
            parts.append(f"{'above' if self.low_open else 'at least'} {_number(self.low)}")
        if self.high is not None:
            parts.append(f"{'below' if self.high_open else 'at most'} {_number(self.high)}")
        return " and ".join(parts)

    def problem(self, value: Any) -> str | None:
        """Why `value` is refused ("must be ..., not ..."), or None when it is allowed."""
        if value is None:
            return None
        if self.choices:
            return None if value in self.choices else f"must be {self.rule()}, not {value!r}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None  # a switch or a text: its type is the only rule
        inside = math.isfinite(value)
        if inside and self.low is not None:
            inside = value > self.low if self.low_open else value >= self.low
        if inside and self.high is not None:
            inside = value < self.high if self.high_open else value <= self.high
        return None if inside else (f"must be {self.rule() or 'a finite number'}, "
                                    f"not {_number(value)}")


def _number(value: float) -> str:
    """A bound or value as people write it: a whole number in full (2**63 is not 9.22337e+18),
    a fraction in its shortest form."""
    if isinstance(value, int) or (math.isfinite(value) and value == int(value)
                                  and abs(value) < 1e21):
        return f"{int(value):,}" if abs(value) >= 100_000 else str(int(value))
    return f"{value:g}"


def setting(default: Any = dataclasses.MISSING, *, label: str = "", unit: str = "",
            flag: str = "", choices: tuple[str, ...] = (), http: bool = True,
            **bounds: float) -> Any:
    """A dataclass field with its `Setting`; `bounds`: at_least or above, at_most or below."""
    if unknown := set(bounds) - {"at_least", "above", "at_most", "below"}:
        raise TypeError(f"unknown bound(s) {sorted(unknown)}")
    above, below = bounds.get("above"), bounds.get("below")
    rule = Setting(label=label, unit=unit,
                   low=above if above is not None else bounds.get("at_least"),
                   low_open=above is not None,
                   high=below if below is not None else bounds.get("at_most"),
                   high_open=below is not None, choices=tuple(choices), flag=flag, http=http)
    return dataclasses.field(default=default, metadata={"setting": rule})


def section(name: str) -> Any:
    """Class decorator: `cls` is the config section `name` (setting paths "name.field")."""
    def register(cls: type) -> type:
        cls.__section__ = name  # type: ignore[attr-defined]
        SECTIONS[name] = cls
        return cls
    return register


class SettingError(ValueError):
    """A config value refused by its field's rule; `path` names the setting."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why

    def as_input(self) -> InputError:
        """The refusal as users get it: the setting as data (`{section.field}`), which each
        surface words its way (the CLI as the flag, the window as the field's label)."""
        return InputError(f"{{{self.path}}} {self.why}.")


def refuse_unknown(cls: type, names: Any, what: str, known_as: str) -> None:
    """Refuse `names` that are not fields of `cls`, naming them (`what`: "speech option")
    and the known ones (`known_as`: "options")."""
    known = {f.name for f in dataclasses.fields(cls)}
    if unknown := sorted(set(names) - known):
        raise InputError(f"Unknown {what}(s): {', '.join(unknown)}.",
                         f"Known {known_as}: {', '.join(sorted(known))}.")


def rules(cls: type) -> dict[str, Setting]:
    """The `Setting` of each field of `cls` that has one (or a plain one)."""
    return {f.name: f.metadata.get("setting", Setting()) for f in dataclasses.fields(cls)}


def rule_of(path: str) -> Setting:
    cls, name = lookup(path)
    return rules(cls)[name]


def lookup(path: str) -> tuple[type, str]:
    """("model.predictor_frames") -> (ModelConfig, "predictor_frames"); KeyError if none."""
    section_name, _, name = path.partition(".")
    cls = SECTIONS[section_name]
    if name not in rules(cls):
        raise KeyError(path)
    return cls, name


def path_of(cls: type, name: str) -> str:
    return f"{getattr(cls, '__section__', cls.__name__)}.{name}"


def value_problem(path: str, value: Any) -> str | None:
    """Why `value` cannot be setting `path` ("must be ..., not ..."): its type, then its
    rule; None when it can (None, "not given", always can)."""
    if value is None:
        return None
    cls, name = lookup(path)
    kind = value_type(cls, name)
    if kind is bool and not isinstance(value, bool):
        return f"must be on or off (true or false), not {value!r}"
    if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, int | float)):
        return f"must be a number, not {value!r}"
    if kind is int and int(value) != value:
        return f"must be a whole number, not {value!r}"
    return rules(cls)[name].problem(value)


def by_name(paths: tuple[str, ...]) -> dict[str, str]:
    """{field name: path} of `paths`; a name two sections share is an error (a request
    names its settings by field)."""
    names = {path.rpartition(".")[2]: path for path in paths}
    if len(names) != len(paths):
        raise ValueError(f"two settings share a name in {paths}")
    for path in paths:
        lookup(path)
    return names


def check(obj: Any) -> None:
    """Every field of config object `obj` against its rule; SettingError names the first
    refused. Called from the classes' `__post_init__`."""
    for name, rule in rules(type(obj)).items():
        why = rule.problem(getattr(obj, name))
        if why is not None:
            raise SettingError(path_of(type(obj), name), why)


def flag_of(cls: type, name: str) -> str:
    """The CLI's flag of a field: --field-name unless its setting names another."""
    return rules(cls)[name].flag or "--" + name.replace("_", "-")


def label_of(cls: type, name: str) -> str:
    """The window's words for a field: its label, else its name in words."""
    return rules(cls)[name].label or name.replace("_", " ").capitalize()


def value_type(cls: type, name: str) -> Any:
    """The field's type without `None` (`int | None` -> int)."""
    hint = typing.get_type_hints(cls)[name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else str
    return hint


def default_of(cls: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def walk(cls: type) -> Iterator[tuple[type, str]]:
    """(section class, field) of every setting of `cls`, into its sub-sections."""
    for f in dataclasses.fields(cls):
        kind = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(kind):
            yield from walk(kind)  # type: ignore[arg-type]
        else:
            yield cls, f.name


@functools.cache
def field_help(cls: type) -> dict[str, str]:
    """The `#:` comment right above each field of dataclass `cls`, joined into one line."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # a frozen app without its sources: no help texts
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


#: "{model.predictor_frames}" in an error's text: a setting each surface words its own way
PLACEHOLDER = re.compile(r"\{([a-z_]+\.[a-z_]+)\}")


def window_words(path: str) -> str:
    """A setting as the window names it: its field's label."""
    try:
        return label_of(*lookup(path))
    except KeyError:
        return path
