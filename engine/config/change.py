"""A remedy as data: set one setting to one value, and why.

The memory plan's advice, a refusal and a failure's classifier say what to change as
`Change`s, never as command-line text. Each surface says a change its own way from the
schema: the CLI as the flag its parser takes (`flag_args`, from `schema.flag_of`, the
same mapping the parser is built from), the window as a button that sets the form's
field (`label`, from the field's label), the JSON events and the API as
{"path", "value", "why"} (`to_dict`).

Light: no torch; the window imports it.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.config.schema import flag_of, label_of, lookup, value_problem, value_type


@dataclass(frozen=True)
class Change:
    """Set the setting at `path` (its config path, "data.batch_size") to `value`; `why`
    says what it gains and costs, in words that name no flag and no field."""

    path: str
    value: Any
    why: str

    def __post_init__(self) -> None:
        try:
            lookup(self.path)
        except KeyError:
            raise ValueError(f"no setting {self.path!r} in the schema") from None
        problem = value_problem(self.path, self.value)
        if problem is not None:
            raise ValueError(f"{self.path} {problem}")

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "value": self.value, "why": self.why}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Change:
        return cls(str(data["path"]), data["value"], str(data.get("why") or ""))

    def flag_args(self) -> list[str]:
        """The command-line tokens that make this change: ["--batch-size", "4"],
        ["--activation-checkpointing"], ["--no-lora-predictor"]."""
        cls, name = lookup(self.path)
        flag = flag_of(cls, name)
        if value_type(cls, name) is bool:  # an on/off switch (argparse's --x / --no-x)
            return [flag if self.value else "--no-" + flag[2:]]
        return [flag, _value_text(self.value)]

    def flag(self) -> str:
        return shlex.join(self.flag_args())

    def label(self) -> str:
        """The change in the window's words: "Activation checkpointing: on"."""
        cls, name = lookup(self.path)
        value = ("on" if self.value else "off") if isinstance(self.value, bool) else \
            _value_text(self.value)
        return f"{label_of(cls, name)}: {value}"


def _value_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def as_changes(items: Iterable[Any] | None) -> list[Change]:
    """Changes from what an event, a Ray message or a caller carries: `Change`s or their
    dicts (anything else, such as an older run's advice text, is left out)."""
    out = []
    for item in items or []:
        if isinstance(item, Change):
            out.append(item)
        elif isinstance(item, dict) and "path" in item and "value" in item:
            try:
                out.append(Change.from_dict(item))
            except (KeyError, ValueError):
                continue  # a setting this version does not have
    return out


def cli_lines(changes: Iterable[Change]) -> list[str]:
    """The changes as a terminal says them, one sentence per remedy: why, then the flags
    of the changes that go together (the same `why`): "Lower the batch size ...: about
    2.1 GiB per worker (--batch-size 4 --grad-accum 2)."."""
    groups: dict[str, list[str]] = {}
    for change in changes:
        groups.setdefault(change.why, []).extend(change.flag_args())
    return [f"{why} ({shlex.join(flags)})." if why else f"{shlex.join(flags)}."
            for why, flags in groups.items()]
