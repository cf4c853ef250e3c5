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

from ..entry import note, version  # noqa: F401 - the CLI modules take them from here
from ..errors import EXIT_INTERNAL, EXIT_USAGE, MoonmindError, has_surrogate

#: Annotations only: importing `typing` is a visible share of a `rag search` served by the box's
#: owner, on the thin client's path (owner/client.py). mypy treats this constant like typing's.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable


#: Command modules; each has `register(groups)` that adds its sub-commands.
COMMAND_MODULES = [
    "moonmind_worker.cli.rag",
    "moonmind_worker.cli.navigate",
    "moonmind_worker.cli.worker",
    "moonmind_worker.cli.overlay",
    "moonmind_worker.cli.quality",
    "moonmind_worker.cli.packs",
    "moonmind_worker.cli.job",
    "moonmind_worker.cli.task",
    "moonmind_worker.cli.sync",
    "moonmind_worker.cli.gateway",
    "moonmind_worker.cli.serve",
    "moonmind_worker.cli.mcp",
    "moonmind_worker.cli.completion",
]

#: Which module registers each command, so a command builds only its own parser: building all of
#: them is a large share of a `rag search` through the owner (BENCHMARKS.md, "The warm owner by default").
#: `tests/test_owner.py` checks this table against what the modules register.
COMMANDS: dict[tuple[str, str], str] = {
    ("rag", "index"): "moonmind_worker.cli.rag",
    ("rag", "search"): "moonmind_worker.cli.rag",
    ("rag", "related"): "moonmind_worker.cli.navigate",
    ("rag", "symbols"): "moonmind_worker.cli.navigate",
    ("rag", "overlay"): "moonmind_worker.cli.overlay",
    ("rag", "eval"): "moonmind_worker.cli.quality",
    ("rag", "stats"): "moonmind_worker.cli.quality",
    ("rag", "repos"): "moonmind_worker.cli.quality",
    ("rag", "packs"): "moonmind_worker.cli.packs",
    ("rag", "sync-embedding"): "moonmind_worker.cli.sync",
    ("worker", "doctor"): "moonmind_worker.cli.worker",
    ("job", "start"): "moonmind_worker.cli.job",
    ("job", "finish"): "moonmind_worker.cli.job",
    ("task", "status"): "moonmind_worker.cli.task",
    ("gateway", "serve"): "moonmind_worker.cli.gateway",
    ("gateway", "add-token"): "moonmind_worker.cli.gateway",
    ("serve", ""): "moonmind_worker.cli.serve",
    ("mcp", ""): "moonmind_worker.cli.mcp",
    ("completion", ""): "moonmind_worker.cli.completion",
}

#: Commands without sub-commands (`moonmind serve`, `moonmind mcp`, `moonmind completion`).
SINGLE = ("serve", "mcp", "completion")

GROUPS = {
    "rag": "retrieval: index, search and related tools",
    "worker": "worker set-up checks",
    "job": "job lifecycle hooks",
    "task": "queued Celery tasks: read one back",
    "gateway": "the RetrievalGateway HTTP service",
}

#: Examples at the end of each main command's --help (`epilog`), by command path ('' is `moonmind`).
#: `tests/test_terminal_view.py` parses every one of them.
EXAMPLES: dict[str, str] = {
    "": """\
  moonmind rag index . --repo myrepo                  index this tree (run it again after changes)
  moonmind rag search "where are bearer tokens checked" --repo myrepo
  moonmind rag repos                                  what is indexed
  moonmind worker doctor                              check that retrieval works here
  source <(moonmind completion bash)                  complete commands and flags in this shell""",
    "rag index": """\
  moonmind rag index . --repo myrepo
  moonmind rag index ~/src/api --repo api --tenant acme --json""",
    "rag search": """\
  moonmind rag search "where are bearer tokens checked" --repo myrepo
  moonmind rag search "retry with backoff" --top-k 3 --full       the whole pack, as a pipe gets it
  moonmind rag search "connection pool" --filters language=python --json
  moonmind rag search "cache ttl" --repo myrepo | pbcopy              piped: the context block to paste""",
    "rag related": """\
  moonmind rag related auth/tokens.py#L10-L40 --repo myrepo       code like these lines, the lines themselves left out
  moonmind rag related auth/tokens.py#3 --top-k 5 --json          by chunk id (a pack item's chunk_id)""",
    "rag symbols": """\
  moonmind rag symbols verify_token --repo myrepo                 where it is defined: path#lines, kind, signature
  moonmind rag symbols Router.handle --filters language=go --json""",
    "rag repos": """\
  moonmind rag repos
  moonmind rag repos --tenant acme --json""",
    "rag stats": """\
  moonmind rag stats --repo myrepo
  moonmind rag stats --repo myrepo --root . --json""",
    "rag overlay": """\
  moonmind rag overlay upsert src/app.py src/removed.py --run-id run-1
  moonmind rag overlay list --run-id run-1
  moonmind rag overlay clean --run-id run-1""",
    "rag eval": """\
  moonmind rag eval --queries queries.json --repo myrepo --k 10""",
    "worker doctor": """\
  moonmind worker doctor
  moonmind worker doctor --json""",
    "job start": """\
  moonmind job start --manifest job.json --env-file job.env""",
    "gateway serve": """\
  moonmind gateway add-token --name ci --repo myrepo
  moonmind gateway serve --port 8088""",
    "completion": """\
  source <(moonmind completion bash)
  moonmind completion bash > ~/.local/share/bash-completion/completions/moonmind
  moonmind completion zsh > ~/.zfunc/_moonmind      with fpath=(~/.zfunc $fpath) before compinit in ~/.zshrc""",
}


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter without `shutil`: every parser builds one, and importing shutil (for the
    terminal width, which only help output needs) slows every command's start."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None) -> None:
        if width is None:
            width = _terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Text of several lines (the examples) as written; one line is filled as argparse does."""
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _terminal_columns() -> int:
    """shutil.get_terminal_size().columns: $COLUMNS, else the terminal's, else 80."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]  # None without a stdout: caught
    except (AttributeError, ValueError, OSError):
        return 80


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors through the same envelope and exit code, with a "did you mean"."""

    _hint: str | None = None  # what an invalid choice was probably meant to be (`_check_value` → `error`)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse's, with unknown flags reported by the command they were given to (not `moonmind`), and the closest flag."""
        argv = sys.argv[1:] if args is None else list(args)
        parsed, extras = self.parse_known_args(argv, namespace)
        if extras:
            chosen = _chosen(self, argv)
            raise MoonmindError("invalid_argument", f"{chosen.prog}: unrecognized arguments: {' '.join(extras)}",
                                _did_you_mean(_closest_flag(chosen, extras)) + f"See `{chosen.prog} --help`.")
        return parsed

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError:
            self._hint = _closest_choice(self, action, value)  # for `error`, which argparse calls next
            raise

    def error(self, message: str) -> None:  # type: ignore[override]
        hint, self._hint = getattr(self, "_hint", None), None
        raise MoonmindError("invalid_argument", f"{self.prog}: {message}", _did_you_mean(hint) + f"See `{self.prog} --help`.")


def _did_you_mean(hint: str | None) -> str:
    return f"Did you mean `{hint}`? " if hint else ""


def _chosen(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub-)command parser `argv` names: `moonmind rag search ...` → the parser of `rag search`."""
    for token in argv:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None:
            break
        if token in sub.choices:
            parser = sub.choices[token]
    return parser


def _closest_flag(parser: argparse.ArgumentParser, extras: list[str]) -> str | None:
    """The command's flag an unknown one was probably meant to be (`--top_k` → `--top-k`)."""
    import difflib

    flags = [f for f in parser._option_string_actions if f.startswith("--")]
    for token in extras:
        if not token.startswith("-"):
            continue
        given = token.split("=", 1)[0]
        dashed = "--" + given.lstrip("-").replace("_", "-").lower()
        if dashed in flags:
            return dashed
        close = difflib.get_close_matches(given, flags, n=1, cutoff=0.6)
        if close:
            return close[0]
    return None


def _closest_choice(parser: argparse.ArgumentParser, action: argparse.Action, value: Any) -> str | None:
    """What an invalid choice was probably meant to be: a command in its group (`moonmind search` →
    `moonmind rag search`), a mistyped command (`rag serch` → `moonmind rag search`), or a value."""
    import difflib

    choices = [str(c) for c in action.choices or ()]
    value = str(value)
    if not isinstance(action, argparse._SubParsersAction):
        close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
        return close[0] if close else None
    if action.dest == "group":  # `moonmind WORD`: WORD may be a command of a group
        commands = [" ".join(k).strip() for k in COMMANDS]
        named = [c for c in commands if c.split()[-1] == value]
        if named:
            return f"moonmind {named[0]}"
        close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
        if close:
            return f"moonmind {close[0]}"
        by_name = {c.split()[-1]: c for c in reversed(commands)}
        close = difflib.get_close_matches(value, list(by_name), n=1, cutoff=0.6)
        return f"moonmind {by_name[close[0]]}" if close else None
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    return f"{parser.prog} {close[0]}" if close else None


def modules_for(argv: list[str] | None) -> list[str]:
    """The command modules `argv` needs: the one that registers its command, or all (help, a typo)."""
    if argv:
        key = (argv[0], "") if argv[0] in SINGLE else (argv[0], argv[1] if len(argv) > 1 else "")
        if key in COMMANDS:
            return [COMMANDS[key]]
    return COMMAND_MODULES


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`'s command (every command when `argv` is None or names none)."""
    parser = _Parser(prog="moonmind", description="Deterministic retrieval for coding-agent workers.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    top = parser.add_subparsers(dest="group", metavar="{" + ",".join([*GROUPS, *SINGLE]) + "}", parser_class=_Parser)
    groups: dict[str, Any] = {"root": top}
    for name, help_text in GROUPS.items():
        p = top.add_parser(name, help=help_text)
        groups[name] = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
        p.set_defaults(_group_parser=p)
    for module in modules_for(argv):
        importlib.import_module(module).register(groups)
    for path, text in EXAMPLES.items():
        command = _subparser(parser, path.split())
        if command is not None:  # registered (a command builds only its own parser)
            command.epilog = "examples:\n" + text
    return parser


def _subparser(parser: argparse.ArgumentParser, names: list[str]) -> argparse.ArgumentParser | None:
    """The parser of the command `names` ([] for `moonmind`), None when it is not registered."""
    for name in names:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or name not in sub.choices:
            return None
        parser = sub.choices[name]
    return parser


def print_error(err: MoonmindError, as_json: bool) -> None:
    from ..settings import get_settings

    try:
        secrets = get_settings().secrets()
    except Exception:  # noqa: BLE001 - settings themselves may be what is broken
        secrets = []
    env = err.envelope(secrets)
    if as_json:
        sys.stderr.write(json.dumps(env) + "\n")
    else:
        from ..text.terminal import printable

        e = env["error"]  # message text may come from a server or a file name: printed safe
        sys.stderr.write(printable(f"error[{e['code']}]: {e['message']}\n  action: {e['action']}\n"))


def write_atomic(path: str, data: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(data)
    os.replace(tmp, path)


def run() -> None:
    """The `moonmind` console script: `main()`, then exit without interpreter teardown.

    Why: tearing down the modules and the engine's objects of a one-shot command is a sizeable
    share of its wall time, spent for nothing. Buffered store writes are flushed by `main` first.
    """
    one_thread_blas()
    if sys.argv[1:3] == ["rag", "search"]:
        # One search leaves a few hundred objects in reference cycles, but a one-shot one imports
        # enough (pydantic, the pipeline) to run the cyclic collector dozens of times, for nothing,
        # as the process ends right after. The thin client's path allocates too little to notice.
        import gc

        gc.disable()
    from .. import process

    process.one_shot = True
    rc = main(_ending=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            pass
    os._exit(rc)


def one_thread_blas() -> None:
    """One OpenBLAS thread in this command's process and the owner it starts, unless the caller chose a count.

    Why: a document's vector is a matrix product (`StaticEmbedder._mean_rows`) whose last bits
    depend on how many threads OpenBLAS splits it over, and the index workers run one thread each
    (indexing/workers.py says why); one here too gives the same vectors whichever process embeds a
    file: this one, an owner, a worker. A one-shot search's one query is far too small for threads.
    Set before numpy loads, which reads it once.
    """
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv: list[str] | None = None, *, _ending: bool = False) -> int:
    argv = sys.argv[1:] if argv is None else argv
    as_json = "--json" in argv
    if argv[:1] == ["--version"]:
        sys.stdout.write(f"moonmind {version()}\n")
        return 0
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        _refuse_text_that_is_not_unicode(args)
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
        progress = sys.modules.get("moonmind_worker.cli.progress")
        if progress is not None:
            progress.break_line()  # a bar's line is ended first, so this starts a line of its own
        sys.stderr.write("interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - no traceback reaches the user
        if os.environ.get("MOONMIND_DEBUG"):
            raise
        from ..errors import disk_full_from

        full = disk_full_from(exc, os.environ.get("MOONMIND_HOME") or os.getcwd(), "a write")
        if full is not None:  # a write outside the store (its lock, a pack, a report) found the disk full
            print_error(full, as_json)
            return full.exit_code
        print_error(MoonmindError(
            "internal_error",
            f"Unexpected {type(exc).__name__}.",
            "Re-run with MOONMIND_DEBUG=1 for the traceback and report it.",
        ), as_json)
        return EXIT_INTERNAL
    finally:
        _release_resources(flush_only=_ending)


#: Arguments that name files: any bytes the filesystem allows are fine there.
_PATH_ARGUMENTS = frozenset({"path", "paths", "root", "manifest", "queries", "output_file", "env_file", "tokens_file"})


def _refuse_text_that_is_not_unicode(args: argparse.Namespace) -> None:
    """Argv bytes that are not UTF-8 (decoded as lone surrogates) in a name, id or query are the
    caller's error here, before they fail deep inside as an internal one (a repo, tenant or run id
    is stored, compared and printed as text)."""
    for name, value in vars(args).items():
        if name.startswith("_") or name in _PATH_ARGUMENTS:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and has_surrogate(item):
                raise MoonmindError(
                    "invalid_argument",
                    f"--{name.replace('_', '-')} holds bytes that are not valid UTF-8.",
                    "Pass text encoded as UTF-8.",
                )


def _release_resources(flush_only: bool = False) -> None:
    """Close stores before the interpreter tears down (releases the embedded store's lock cleanly,
    and keeps qdrant-client's own shutdown hook from printing a traceback); only flush them when
    the process ends right after without teardown (`run`)."""
    runtime = sys.modules.get("moonmind_worker.runtime")
    if runtime is not None:
        runtime.close_all(flush_only=flush_only)


if __name__ == "__main__":
    run()
