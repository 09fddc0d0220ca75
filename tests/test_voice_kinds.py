"""The kind of a voice is one of three enums (`engine.core.kinds`), never a bare string.

Every comparison, default and constructor names a member: a word spelled out again in a
comparison (`source.kind == "adapter"`, `t["tier"] in ("instant", "full")`) or passed as
`kind=`/`tier=` is found here. The strings on disk and on the wire stay the same.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.core.errors import WorkspaceError
from engine.core.kinds import ServedKind, Tier, VoiceKind, parse_kind
from tests.helpers.imports import ROOT

#: every word a kind of voice is written as
WORDS = {m.value for kind in (VoiceKind, Tier, ServedKind) for m in kind}
#: an operand that reads a kind: `kind`, `x.tier`, `x["kind"]`, `x.get("tier")`
KIND_READ = re.compile(r"\b(kind|tier)\b")


def _words_in(node: ast.expr) -> list[str]:
    """The kind words `node` spells out: a string, or the strings of a tuple, list or set."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in WORDS]


def spelled_kinds(source: str) -> Iterator[tuple[int, str]]:
    """(line, code) of each kind word compared with a kind, or passed as `kind=`/`tier=`."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            reads = [o for o in operands if KIND_READ.search(ast.unparse(o))]
            if reads and any(_words_in(o) for o in operands if o not in reads):
                yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.keyword) and node.arg in ("kind", "tier") \
                and _words_in(node.value):
            yield node.value.lineno, ast.unparse(node)


def test_no_kind_of_voice_is_spelled_as_a_string() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {code}"
             for part in ("engine", "gui") for path in sorted((ROOT / part).rglob("*.py"))
             if "__pycache__" not in path.parts
             for line, code in spelled_kinds(path.read_text(encoding="utf-8"))]
    assert found == []


@pytest.mark.parametrize("code", [
    'source.kind == "adapter"',
    'x if t["tier"] != "instant" else y',
    'src.get("kind") in ("export", "checkpoint")',
    'kind == "zero_shot"',
    'VoiceSource(kind="custom_voice", model_dir=p)',
    'ServedVoice(n, p, kind, lang, tier="full")',
])
def test_a_spelled_kind_is_found(code: str) -> None:
    assert [line for line, _ in spelled_kinds(code)] == [1]


@pytest.mark.parametrize("code", [
    "source.kind == VoiceKind.ADAPTER",
    'info.model_type != "base"',
    'event.kind in ("result", "error")',
    't["tier"] in (Tier.INSTANT, Tier.FULL)',
])
def test_other_words_and_members_pass(code: str) -> None:
    assert list(spelled_kinds(code)) == []


def test_members_read_and_write_the_same_strings() -> None:
    assert [k.value for k in VoiceKind] == ["custom_voice", "checkpoint", "adapter", "zero_shot"]
    assert [t.value for t in Tier] == ["instant", "adapter", "full"]
    assert [k.value for k in ServedKind] == ["voice", "run", "export", "adapter", "instant",
                                            "reference"]
    # JSON writes the word, and the word read back is the member
    assert json.dumps({"kind": VoiceKind.ZERO_SHOT}) == '{"kind": "zero_shot"}'
    assert json.loads(json.dumps(Tier.FULL)) == Tier.FULL
    assert parse_kind(Tier, "adapter", "a record") is Tier.ADAPTER
    assert {t: t.voice_kind for t in Tier} == {Tier.INSTANT: VoiceKind.ZERO_SHOT,
                                               Tier.ADAPTER: VoiceKind.ADAPTER,
                                               Tier.FULL: VoiceKind.CUSTOM_VOICE}
    assert [ServedKind.of_tier(t) for t in Tier] == ["instant", "adapter", "export"]


def test_an_unknown_word_is_refused_in_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError) as caught:
        parse_kind(VoiceKind, "lora", str(tmp_path / "evaluation.json"))
    assert "evaluation.json names an unknown VoiceKind 'lora'" in caught.value.message
    assert "custom_voice, checkpoint, adapter, zero_shot" in str(caught.value.hint)


def test_an_evaluation_names_its_kinds_as_members(tmp_path: Path) -> None:
    """evaluation.json is read at the edge: each entry's kind a `VoiceKind`, an unknown
    one refused with the file named, and the window shows no evaluation for it."""
    from engine.layout.run import Run
    from gui.pages.train.evaluation import catalog_evaluation

    run = Run(tmp_path / "runs" / "r1")
    run.evaluation_dir.mkdir(parents=True)
    entries = [{"kind": "checkpoint", "step": 2}, {"kind": "zero_shot"}]
    run.evaluation_file.write_text(json.dumps({"format": 1, "entries": entries}))
    read = run.evaluation()
    assert read is not None
    assert [e["kind"] for e in read["entries"]] == [VoiceKind.CHECKPOINT, VoiceKind.ZERO_SHOT]
    assert all(type(e["kind"]) is VoiceKind for e in read["entries"])

    entries.append({"kind": "lora"})
    run.evaluation_file.write_text(json.dumps({"format": 1, "entries": entries}))
    with pytest.raises(WorkspaceError, match="unknown VoiceKind 'lora'") as caught:
        run.evaluation()
    assert str(run.evaluation_file) in caught.value.message
    assert catalog_evaluation(run.path) is None
