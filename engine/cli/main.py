"""Entry point of `voxshard-engine`.

Output contract:
- `--json`: one JSON event per line on stdout (progress, log, metric,
  artifact, state, result, error); nothing else is printed on stdout.
- otherwise: human lines and progress bars on stderr, the result on stdout.
- exit code 0 only on success; 1 on a deliberate error (one sentence, no
  traceback unless `--debug`); 2 on bad usage; 130 when cancelled.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any, TextIO

from engine.cli.output import HumanOutput, JsonOutput
from engine.cli.settings import FLAGS, add_set_options, apply_set
from engine.config.change import cli_lines
from engine.core.errors import Cancelled, VoxshardError
from engine.core.events import Emitter

# Modules that contribute sub-commands; each has `register(subparsers)`.
COMMAND_MODULES = (
    "engine.cli.cmd_model",
    "engine.cli.cmd_voice",
    "engine.cli.cmd_train",
    "engine.cli.cmd_speak",
    "engine.cli.cmd_status",
    "engine.cli.cmd_quality",  # after cmd_voice: adds --transcribe to `import`
    "engine.cli.cmd_reinforce",
    "engine.cli.cmd_serve",
    "engine.cli.cmd_read",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse exits with 2 itself; keep its one-line style
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def cli_words(path: str) -> str:
    """A setting an error names, as the CLI says it: the flag a command takes for it, else
    its config name ("model.subtalker_weight", a field of voice.toml or a run's config)."""
    if not FLAGS:
        build_parser()  # an error raised before the parser was built (a script, a test)
    return FLAGS.get(path, path)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="voxshard-engine",
                     description="Voxshard headless engine: prepare, train and speak.")
    parser.add_argument("--json", action="store_true",
                        help="emit one JSON event per line on stdout")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # area not built yet
                continue
            raise
        module.register(sub)
    add_set_options(sub)
    return parser


def _add_common(parser: argparse.ArgumentParser) -> None:
    # `--json`/`--debug` are accepted after the sub-command too
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)


def add_command(sub: Any, name: str, func: Any, help: str,
                **kwargs: Any) -> argparse.ArgumentParser:
    """Register one sub-command whose handler is `func(args, emitter) -> dict`."""
    p = sub.add_parser(name, help=help, description=help, **kwargs)
    _add_common(p)
    p.set_defaults(func=func)
    return p


def sub_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of one sub-command of `parser`."""
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subs.choices[command]


def _install_signal_handlers() -> None:
    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)


def private_stdout() -> TextIO:
    """A stream on the real stdout reserved for JSON events.

    File descriptor 1 is pointed at stderr, so prints from libraries and
    child processes (Ray, transformers) can never corrupt the event stream.
    """
    sys.stdout.flush()
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1, encoding="utf-8")


#: arguments that name a local file or folder: `~` expanded, made absolute against the
#: current folder here, once, so nothing downstream (Ray, its workers) sees a relative path
PATH_ARGS = frozenset({"path", "voice", "paths", "transcripts", "out_dir", "output",
                       "text_file", "sentences_file", "reference", "storage", "voices",
                       "workspace", "api_key_file", "script", "project"})
#: arguments that are a path *or* a hub id / URI: only a leading `~` is expanded, and
#: a relative path that exists is made absolute; a hub id passes unchanged
PATH_OR_ID_ARGS = frozenset({"model", "base", "target"})


def normalize_paths(args: argparse.Namespace) -> None:
    """Paths as typed (relative, `~`, spaces, non-ASCII) work in every command."""
    from engine.core.storage import expand_arg, storage_arg, user_path

    def fix(name: str, value: Any) -> Any:
        if not isinstance(value, str) or value in ("", "-"):
            return value
        if name == "storage":
            keep = value.strip().lower() in ("default", "local")
            return value if keep else storage_arg(value)
        if name in PATH_OR_ID_ARGS:
            return expand_arg(value)
        return str(user_path(value))

    for name in PATH_ARGS | PATH_OR_ID_ARGS:
        value = getattr(args, name, None)
        if value is None:
            continue
        try:
            if isinstance(value, list):
                setattr(args, name, [fix(name, v) for v in value])
            else:
                setattr(args, name, fix(name, value))
        except (TypeError, ValueError):
            continue  # left as typed; the command says what is wrong with it


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    normalize_paths(args)
    output = JsonOutput(private_stdout()) if args.json else HumanOutput(sys.stderr)
    emitter = Emitter(output.handle)
    _install_signal_handlers()
    try:
        apply_set(sub_parser(parser, args.command), args)
        result = args.func(args, emitter)
    except Cancelled as exc:
        output.error("cancelled", exc.message, exc.hint)
        return 130
    except KeyboardInterrupt:
        output.error("cancelled", "Cancelled.", None)
        return 130
    except VoxshardError as exc:
        if args.debug:
            traceback.print_exc(file=sys.stderr)
        message, hint = exc.worded(cli_words)  # a setting named as its flag
        # a remedy that sets settings: its flags here, its data for the window
        hint = " ".join([*([hint] if hint else []), *cli_lines(exc.changes)]) or None
        named = {"settings": exc.settings, "template": exc.template,
                 "hint_template": exc.hint_template,
                 "changes": [c.to_dict() for c in exc.changes]} \
            if exc.settings or exc.changes else None
        output.error(exc.code, message, hint, exc.window_hint, named)
        return 1
    except Exception as exc:  # a bug: still one line unless --debug
        if args.debug:
            traceback.print_exc(file=sys.stderr)
        output.error("internal", f"Internal error: {type(exc).__name__}: {exc}",
                     "Run again with --debug and report the traceback.")
        return 1
    output.result(result if result is not None else {})
    return 0


if __name__ == "__main__":
    sys.exit(main())
