"""Read a script or a book in cloned voices: a project of takes, exported whole.

`read(request)` parses the script (`script`), plans each line's voice, text and parts
(`project`: a take is a sentence group of a line, its own key, seeds and chosen one),
renders the parts without a take on the warm worker (`render`), then writes the export
(`export`: each line its parts' chosen takes joined). Each step keeps to its own module;
only `render` and `export` load torch.
"""

from __future__ import annotations

import threading
from typing import Any

from engine.config.read import ReadRequest
from engine.core.events import Emitter
from engine.read.project import Plan, choose, make_plan, save_request, style_notes


def read(request: ReadRequest, emitter: Emitter, cancel: threading.Event | None = None
         ) -> dict[str, Any]:
    """Render what is missing of `request.script`'s lines, then export (`request.out`)."""
    # torch loads with these (start-up cost: the window imports this package's project)
    from engine.read.export import export  # noqa: PLC0415
    from engine.read.render import render_missing  # noqa: PLC0415

    plan = make_plan(request)
    save_request(plan)
    moved = other_model_note(plan)
    if moved:
        emitter.log(moved, level="warning", lines=plan.other_model)
    for number, words in style_notes(plan):
        emitter.log(words, level="warning", line=number)
    whole = whole_note(plan)
    if whole:
        emitter.log(whole, level="info", lines=plan.whole_lines)
    for item in request.pick:
        target, _, seed = item.partition("=")
        choose(plan, target, int(seed))
    rendered = render_missing(plan, emitter, cancel)
    result: dict[str, Any] = {"project": str(plan.project), "lines": len(plan.lines),
                              "chapters": len(plan.script.chapters), **rendered}
    if request.out:
        emitter.state("exporting", path=request.out)
        result["export"] = export(plan, request.out)
    flagged = result["flagged"]
    result["other_model"] = plan.other_model
    result["summary"] = (f"{len(plan.lines)} lines in {len(plan.script.chapters)} chapter(s): "
                         f"{rendered['rendered']} rendered, {rendered['reused']} kept"
                         + (f"; {moved}" if moved else "")
                         + (f"; lines {', '.join(map(str, flagged))} flagged" if flagged else "")
                         + (f"; wrote {request.out} ({result['export']['level']})"
                            if request.out else "")
                         + (f"; {result['export']['check']['words']}"
                            if request.out and "check" in result["export"] else ""))
    return result


def whole_note(plan: Plan) -> str:
    """Which lines of several parts keep the whole-line take they were rendered as (before
    takes were cut in parts), and how to have them in parts ("" for none)."""
    lines = plan.whole_lines
    if not lines:
        return ""
    shown = ", ".join(map(str, lines[:10])) + (", ..." if len(lines) > 10 else "")
    return (f"{len(lines)} line{'s' if len(lines) != 1 else ''} ({shown}) keep the whole-line "
            "take made before takes were cut into sentence groups; a new take of a line "
            "(--regenerate N) makes its parts")


def other_model_note(plan: Plan) -> str:
    """How many lines' takes are from another model of their voice than it speaks with
    now, and what becomes of them ("" for none)."""
    if not plan.other_model:
        return ""
    count = len(plan.other_model)
    voices = sorted({plan.line(n).voice.name for n in plan.other_model})
    what = ("kept, as asked" if plan.request.keep_other_models
            else "rendered again (ask to keep other models' takes to keep them)")
    return (f"{count} line{'s' if count != 1 else ''} now from another model of "
            f"{', '.join(voices)}: {what}")
