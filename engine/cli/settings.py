"""CLI flags made from the config dataclasses: a setting's type, default and help live once.

A field documented in `engine/config/` with a `#:` comment above it becomes a
flag whose help is that comment and whose "(default ...)" is the field's own
default, so the command line can never repeat a default that has since changed. A field
declared with `engine.config.schema.setting` gives its flag, its choices and its bounds
too: a value outside them is refused by the parser, in the field's own words.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from engine.config.layers import assignments, read_file
from engine.config.schema import default_of, field_help, flag_of, path_of, rules, value_type

__all__ = ["FIELD", "FLAGS", "add_field", "add_layer_options", "add_set_options",
           "apply_set"]

#: {"section.field": flag} of every setting a command takes, filled as the parser is built
FLAGS: dict[str, str] = {}

#: `add_field(..., default=FIELD)`: argparse's default is the field's own (the value is
#: always set, for settings built straight from the parsed flags)
FIELD: Any = object()


def _shown(value: Any) -> str:
    if isinstance(value, float) and value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return str(value)


def _checked(cls: type, name: str, kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """The text of a flag as the field's type, refused outside the field's bounds."""
    rule = rules(cls)[name]

    def convert(text: str) -> Any:
        value = kind(text)
        why = rule.problem(value)
        if why is not None:
            raise argparse.ArgumentTypeError(why)
        return value

    convert.__name__ = getattr(kind, "__name__", "value")  # argparse names it in errors
    return convert


def add_field(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
              name: str, *, flag: str | None = None, help: str | None = None,
              default: Any = None, show_default: bool = True,
              type: Callable[[str], Any] | None = None, **kwargs: Any) -> argparse.Action:
    """Add `--flag` for field `name` of `cls`.

    `default` is argparse's own (None by default: "not given", so the engine or
    the voice's saved settings decide); the help shows the field's default.
    A bool field is an on/off switch.
    """
    flag = flag or flag_of(cls, name)
    FLAGS.setdefault(path_of(cls, name), flag)
    text = help or field_help(cls).get(name) or name.replace("_", " ")
    shown = default_of(cls, name)
    rule = rules(cls)[name]
    notes = [rule.rule()] if rule.rule() and not rule.choices else []
    if show_default and shown is not None and not isinstance(shown, bool):
        notes.append(f"default {_shown(shown)}")
    if notes:
        text = f"{text} ({'; '.join(notes)})"
    text = text.replace("%", "%%")  # argparse formats help with %
    kind = value_type(cls, name)
    kwargs.setdefault("dest", name)
    if rule.choices:
        kwargs.setdefault("choices", rule.choices)
    if default is FIELD:
        default = shown
    if kind is bool:
        kwargs.setdefault("action", argparse.BooleanOptionalAction)
        action = parser.add_argument(flag, default=default, help=text, **kwargs)
    else:
        converter = type or _checked(cls, name, kind if kind in (int, float, str) else str)
        action = parser.add_argument(flag, type=converter, default=default, help=text,
                                     **kwargs)
    if hasattr(cls, "__section__") and kwargs.get("action") != "append":
        action.setting_path = path_of(cls, name)  # type: ignore[attr-defined]  # --set
    return action


def add_layer_options(parser: argparse.ArgumentParser, what: str) -> None:
    """`--set section.field=value` (any setting by its path, repeatable) and `--config FILE`
    (a whole config as a layer under the flags); the engine checks both by the schema
    (`engine.config.layers`)."""
    parser.add_argument("--set", action="append", default=[], dest="set_values",
                        metavar="SECTION.FIELD=VALUE",
                        help=f"any {what} setting by its path, repeatable (e.g. --set "
                             "optim.weight_decay=0); checked by the setting's own rule")
    parser.add_argument("--config", default=None, dest="config_file", metavar="FILE",
                        help=f"a whole {what} config, JSON or TOML (a run's config.json "
                             "too): its settings come after the flags' and --set's")


def _settings_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """{path: its flag's action} of every setting a command's parser takes as a flag."""
    return {a.setting_path: a for a in parser._actions  # type: ignore[attr-defined]
            if getattr(a, "setting_path", None)}


def add_set_options(sub: Any) -> None:
    """`--set section.field=value` and `--config FILE` on every command that takes settings
    and has no `--set` of its own (`train` and `plan` take any training setting,
    `add_layer_options`): the command's settings by their paths, as its flags give them."""
    for parser in set(sub.choices.values()):
        known = _settings_of(parser)
        if known and "--set" not in parser._option_string_actions:
            action = parser.add_argument(
                "--set", action="append", default=[], dest="set_values",
                metavar="SECTION.FIELD=VALUE",
                help="a setting of this command by its path, repeatable (e.g. --set "
                     f"{sorted(known)[0]}=...); its flag, when given too, wins")
            action.by_flags = True  # type: ignore[attr-defined]  # `apply_set` applies it
            parser.add_argument("--config", default=None, dest="config_file",
                                metavar="FILE",
                                help="this command's settings from a JSON or TOML file "
                                     "(its [section] tables); its flags and --set win")


def apply_set(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Each `--set`, then each setting of `--config`, of a command whose `--set` stands for
    its flags (`add_set_options`) given to the flag's destination, checked by the
    setting's rule; a flag given too wins. InputError for a path the command does not take
    or a value its rule refuses."""
    action = parser._option_string_actions.get("--set")
    if not getattr(action, "by_flags", False):
        return
    known = _settings_of(parser)
    values = read_file(args.config_file, known) if args.config_file else {}
    values.update(assignments(args.set_values, known))
    for path, value in values.items():
        flag = known[path]
        if getattr(args, flag.dest, None) == flag.default:
            setattr(args, flag.dest, value)
