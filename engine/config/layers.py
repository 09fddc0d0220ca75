"""A setting's value from the first layer that gives it, and where that value came from.

The layers of a training run, first wins: the request (CLI flags and `--set`, the API's
keywords, the window's form, HTTP fields), a whole config given by file (`--config`),
the devices found, the run being resumed, the voice's voice.toml, the preset for the model
and the data volume, the schema's default. Each layer is a flat map {"section.field":
value} read from a partial tree (`flatten`), so no layer needs code per field; `merge`
takes the first value of each setting and records its source, which the dry run and the
run's saved config show ("optim.lr 4e-06 from the preset for 0.6B").

Light: no torch (the window imports it).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import typing
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config.schema import default_of, lookup, rule_of, value_problem, value_type
from engine.core.errors import InputError, VoxshardError

#: the source of a value no layer gives
DEFAULT = "the default"
#: the source of the values a surface was asked for (flags, keywords, the window's form)
REQUEST = "the request"
#: the key of a run's saved config.json that holds where each value came from
PROVENANCE_KEY = "provenance"


@dataclass(frozen=True)
class Layer:
    """One source of settings: its words ("the preset for 0.6B") and its values by path
    (None: not given). `chosen`: a person chose these values (a request, a file, a run, a
    voice's settings), so a rule that fits a value to the data leaves them as they are."""

    source: str
    values: Mapping[str, Any] = field(default_factory=dict)
    chosen: bool = False


@dataclass
class Merged:
    """The merged config as its `to_dict()` tree, the source of every value, and the
    paths whose value a person chose (`Layer.chosen`)."""

    tree: dict[str, dict[str, Any]]
    provenance: dict[str, str]
    chosen: set[str] = field(default_factory=set)

    def get(self, path: str) -> Any:
        section_name, _, name = path.partition(".")
        return self.tree[section_name][name]

    def set(self, path: str, value: Any, source: str) -> None:
        """A value a rule decides after the merge (a batch fitted to the clips), with why."""
        section_name, _, name = path.partition(".")
        self.tree[section_name][name] = value
        self.provenance[path] = source

    def lines(self, every: bool = False) -> list[str]:
        """`provenance_lines` of this merge."""
        return provenance_lines(self.tree, self.provenance, every)


def provenance_lines(tree: Mapping[str, Mapping[str, Any]], provenance: Mapping[str, str],
                     every: bool = False) -> list[str]:
    """"optim.lr  4e-06  from the preset for 0.6B", one per value of a config `tree` (not
    the defaults, unless `every`), in columns."""
    rows = [(path, _shown(tree[path.partition(".")[0]][path.partition(".")[2]]), source)
            for path, source in provenance.items() if every or source != DEFAULT]
    # a long value (a model's folder) overflows its column rather than widen it
    wide = [max((len(row[i]) for row in rows if len(row[i]) <= 24), default=0)
            for i in (0, 1)]
    return [f"{path:<{wide[0]}}  {value:<{wide[1]}}  from {source}"
            for path, value, source in rows]


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def sections(root: type) -> dict[str, type]:
    """{section name: its class} of a config tree's root (TrainConfig: model, data, ...)."""
    hints = typing.get_type_hints(root)
    return {f.name: hints[f.name] for f in dataclasses.fields(root)}


def paths(root: type) -> list[str]:
    """Every setting of `root` by its path, in the tree's order."""
    return [f"{name}.{f.name}" for name, cls in sections(root).items()
            for f in dataclasses.fields(cls)]


def merge(root: type, layers: Sequence[Layer]) -> Merged:
    """Each setting of `root` from the first of `layers` that gives it (not None), else
    its field's default; a path no setting has is refused (`flatten` checks them first)."""
    known = set(paths(root))
    for layer in layers:
        if stray := sorted(set(layer.values) - known):
            raise KeyError(f"{layer.source}: no setting {', '.join(stray)}")
    merged = Merged({}, {})
    for section_name, cls in sections(root).items():
        merged.tree[section_name] = {}
        for f in dataclasses.fields(cls):
            path = f"{section_name}.{f.name}"
            layer = next((layer for layer in layers if layer.values.get(path) is not None),
                         None)
            if layer is None:
                merged.set(path, default_of(cls, f.name), DEFAULT)
                continue
            merged.set(path, layer.values[path], layer.source)
            if layer.chosen:
                merged.chosen.add(path)
    return merged


def _unknown(key: str, root: type, source: str, error: type[VoxshardError] = InputError,
             hint: str | None = None) -> VoxshardError:
    """An error naming a key that is no setting of `root`, and the settings there are."""
    section_name = key.partition(".")[0]
    known = sections(root)
    if section_name in known:
        names = ", ".join(f.name for f in dataclasses.fields(known[section_name]))
        what = f"The settings of {section_name} are: {names}."
    else:
        what = f"Settings are named section.field; the sections are: {', '.join(known)}."
    return error(f"{source} names {key}, which is not a setting.",
                 f"{what} {hint}" if hint else what)


def checked(path: str, value: Any, root: type, source: str,
            error: type[VoxshardError] = InputError, hint: str | None = None) -> Any:
    """`value` for setting `path`, or an error (`error`) naming the path, the value and
    what the setting allows."""
    if path not in paths(root):
        raise _unknown(path, root, source, error, hint)
    why = value_problem(path, value)
    if why is not None:
        raise error(f"{source} has {path} = {value!r}; it {why}.", hint or _allowed(path))
    if value_type(*lookup(path)) is int and isinstance(value, float):
        return int(value)  # a whole number JSON wrote as 300.0
    return value


def _allowed(path: str) -> str | None:
    rule = rule_of(path).rule()
    return f"Give {path} a value {rule}." if rule else None


def flatten(tree: Mapping[str, Any], root: type, source: str, skip: tuple[str, ...] = (),
            error: type[VoxshardError] = InputError, hint: str | None = None
            ) -> dict[str, Any]:
    """A partial tree of settings ({"optim": {"lr": 1e-5}}; a field whose name no other
    section shares may stand alone: {"predictor_frames": 0.5}) as {path: value}, each
    value checked by its field's rule (`error` and `hint`: how a refusal is raised).
    `skip`: keys of the tree that are not settings."""
    known = sections(root)
    alone: dict[str, list[str]] = {}
    for path in paths(root):
        alone.setdefault(path.rpartition(".")[2], []).append(path)
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if key in skip:
            continue
        if key in known and isinstance(value, Mapping):
            for name, item in value.items():
                out[f"{key}.{name}"] = checked(f"{key}.{name}", item, root, source, error,
                                               hint)
        elif len(alone.get(key, ())) == 1:
            out[alone[key][0]] = checked(alone[key][0], value, root, source, error, hint)
        elif key in alone:
            raise error(f"{source} names {key}, which {' and '.join(alone[key])} share.",
                        f"Put it in its section, e.g. {alone[key][0]}.")
        else:
            raise _unknown(key, root, source, error, hint)
    return out


_TRUE, _FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")


def assignment(text: str, known: type | Collection[str]) -> tuple[str, Any]:
    """"optim.lr=1e-5" (`--set`) as ("optim.lr", 1e-05): the text as the field's type,
    checked by its rule; an InputError names the path and what it allows. `known`: a
    config tree's root (any of its settings), or the paths a command takes."""
    path, equals, raw = text.partition("=")
    path, raw = path.strip(), raw.strip()
    source = f"--set {text}"
    if not equals or not path:
        raise InputError(f"{source} is not section.field=value.",
                         "Write a setting as --set section.field=value, e.g. --set "
                         "optim.lr=1e-5.")
    if isinstance(known, type):
        if path not in paths(known):
            raise _unknown(path, known, "--set")
    elif path not in known:
        raise InputError(f"--set names {path}, which is not a setting of this command.",
                         f"Its settings are: {', '.join(sorted(known))}.")
    kind = value_type(*lookup(path))
    value: Any = raw
    if kind is bool:
        if raw.lower() not in _TRUE + _FALSE:
            raise InputError(f"{source}: {path} must be true or false, not {raw!r}.",
                             "Write true or false.")
        value = raw.lower() in _TRUE
    elif kind in (int, float):
        try:
            value = kind(raw)
        except ValueError:
            whole = "a whole number" if kind is int else "a number"
            raise InputError(f"{source}: {path} must be {whole}, not {raw!r}.",
                             _allowed(path)) from None
    return path, checked_value(path, value, "--set")


def assignments(texts: Sequence[str], known: type | Collection[str]) -> dict[str, Any]:
    """Every `--set` as {path: value}; the last of one path wins, as with flags."""
    return dict(assignment(text, known) for text in texts)


def read_file(path: str | Path, known: type | Collection[str]) -> dict[str, Any]:
    """A whole config from a JSON or TOML file (a run's saved config.json too, whose
    provenance is not a setting) as {path: value}, each value checked. `known`: a config
    tree's root (the file is a partial tree of it), or the paths a command takes (the
    file's sections of those paths are read, every field of them must be one; other
    sections are for other commands)."""
    file = Path(path).expanduser()
    source = f"The config file {file}"
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"Cannot read the config file {file}: "
                         f"{getattr(exc, 'strerror', None) or exc}.",
                         "Give a JSON or TOML file, such as a run's config.json.") from exc
    try:
        tree = tomllib.loads(text) if file.suffix.lower() == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{source} is not valid {'TOML' if file.suffix == '.toml' else 'JSON'}"
                         f": {exc}.", "Give a JSON or TOML file, such as a run's config.json."
                         ) from exc
    if not isinstance(tree, dict):
        raise InputError(f"{source} does not hold a table of settings.")
    if isinstance(known, type):
        return flatten(tree, known, source, skip=(PROVENANCE_KEY,))
    out: dict[str, Any] = {}
    taken = {p.partition(".")[0] for p in known}
    for section_name, table in tree.items():
        if section_name not in taken:
            continue
        if not isinstance(table, Mapping):
            raise InputError(f"{source} has {section_name} = {table!r}, not a table of "
                             "settings.")
        for name, value in table.items():
            if f"{section_name}.{name}" not in known:
                raise InputError(f"{source} names {section_name}.{name}, which is not a "
                                 "setting of this command.",
                                 f"Its settings are: {', '.join(sorted(known))}.")
            out[f"{section_name}.{name}"] = value
    return {p: checked_value(p, v, source) for p, v in out.items()}


def checked_value(path: str, value: Any, source: str) -> Any:
    """`value` for a known setting `path`, or an InputError naming what it allows."""
    why = value_problem(path, value)
    if why is not None:
        raise InputError(f"{source} has {path} = {value!r}; it {why}.", _allowed(path))
    return value
