"""`moonmind` — the command line. A thin adapter: parse, call the pipeline, print.

Imports stay lazy so a search pays only for what it uses (no qdrant-client or
openai import on the embedded default). Every failure is printed as
`error[code]: message` + the remedy on stderr (the JSON envelope with --json),
nothing is written to stdout, and the exit code says the class of failure.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any, Callable

from .errors import EXIT_INTERNAL, EXIT_USAGE, MoonmindError

#: Command modules; each has `register(groups)` that adds its sub-commands.
COMMAND_MODULES = [
    "moonmind_worker.commands.rag",
    "moonmind_worker.commands.worker",
    "moonmind_worker.commands.overlay",
    "moonmind_worker.commands.quality",
    "moonmind_worker.commands.packs",
    "moonmind_worker.commands.job",
    "moonmind_worker.commands.sync",
    "moonmind_worker.commands.gateway",
    "moonmind_worker.commands.serve",
]

GROUPS = {
    "rag": "retrieval: index, search and related tools",
    "worker": "worker set-up checks",
    "job": "job lifecycle hooks",
    "gateway": "the RetrievalGateway HTTP service",
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors through the same envelope and exit code."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise MoonmindError("invalid_argument", f"{self.prog}: {message}", f"See `{self.prog} --help`.")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="moonmind", description="Deterministic retrieval for coding-agent workers.")
    top = parser.add_subparsers(dest="group", metavar="{" + ",".join([*GROUPS, "serve"]) + "}", parser_class=_Parser)
    groups: dict[str, Any] = {"root": top}
    for name, help_text in GROUPS.items():
        p = top.add_parser(name, help=help_text)
        groups[name] = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
        p.set_defaults(_group_parser=p)
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(groups)
    return parser


def print_error(err: MoonmindError, as_json: bool) -> None:
    from .settings import get_settings

    try:
        secrets = get_settings().secrets()
    except Exception:  # noqa: BLE001 - settings themselves may be what is broken
        secrets = []
    env = err.envelope(secrets)
    if as_json:
        sys.stderr.write(json.dumps(env) + "\n")
    else:
        e = env["error"]
        sys.stderr.write(f"error[{e['code']}]: {e['message']}\n  action: {e['action']}\n")


def note(message: str) -> None:
    """Progress notes and hints go to stderr, never mixed into stdout output."""
    sys.stderr.write(f"note: {message}\n")


def write_atomic(path: str, data: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(data)
    os.replace(tmp, path)


def run() -> None:
    """The `moonmind` console script: `main()`, then exit without interpreter teardown.

    Why: tearing down the modules and the engine's objects of a one-shot command took ~40 ms
    of a ~450 ms `rag search` here. Buffered store writes are flushed by `main` first.
    """
    rc = main(_ending=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            pass
    os._exit(rc)


def main(argv: list[str] | None = None, *, _ending: bool = False) -> int:
    argv = sys.argv[1:] if argv is None else argv
    as_json = "--json" in argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        handler: Callable[[argparse.Namespace], int] | None = getattr(args, "_handler", None)
        if handler is None:
            target = getattr(args, "_group_parser", parser)
            target.print_help(sys.stderr)
            return EXIT_USAGE
        return handler(args)
    except MoonmindError as err:
        print_error(err, as_json)
        return err.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - no traceback reaches the user
        if os.environ.get("MOONMIND_DEBUG"):
            raise
        err = MoonmindError(
            "internal_error",
            f"Unexpected {type(exc).__name__}.",
            "Re-run with MOONMIND_DEBUG=1 for the traceback and report it.",
        )
        print_error(err, as_json)
        return EXIT_INTERNAL
    finally:
        _release_resources(flush_only=_ending)


def _release_resources(flush_only: bool = False) -> None:
    """Close stores before the interpreter tears down (releases the embedded store's lock cleanly,
    and keeps qdrant-client's own shutdown hook from printing a traceback); only flush them when
    the process ends right after without teardown (`run`)."""
    runtime = sys.modules.get("moonmind_worker.runtime")
    if runtime is not None:
        runtime.close_all(flush_only=flush_only)


if __name__ == "__main__":
    run()
