"""`moonmind` in this process, like click's CliRunner: `moonmind_worker.cli.main.main(argv)` with its
own environment, working directory, stdin, captured stdout/stderr and exit code.

Why: a console-script subprocess pays an interpreter start and every import for each command, which
the fast tests do not need. What only a real process shows (the console script's exit without
teardown, signals, a stalled read killed by a timeout, stdin/stdout pipes) stays tested through
`conftest.cli`. The settings cache, the environment, the working directory, the standard streams and
the root logger's handlers are put back after every call, and `main` itself closes the stores it opened.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from conftest import Result


class CliRunner:
    """Invoke the CLI in process, with `env` as the whole environment (as a subprocess would get it)."""

    def __init__(self, env: Mapping[str, str], cwd: Path) -> None:
        self.env = dict(env)
        self.cwd = cwd

    def invoke(self, *args: str, extra_env: Mapping[str, str] | None = None, cwd: Path | None = None,
               input: str = "") -> Result:
        from moonmind_worker.cli.main import main
        from moonmind_worker.settings import get_settings

        saved_env, saved_cwd = dict(os.environ), os.getcwd()
        saved_streams = sys.stdin, sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__
        saved_handlers = list(logging.getLogger().handlers)
        out, err = io.BytesIO(), io.BytesIO()
        # held here: a wrapper that is collected closes the buffer beneath it before it is read
        stdin = io.TextIOWrapper(io.BytesIO(input.encode()), encoding="utf-8")
        stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
        stderr = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True)
        sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
        sys.__stdout__, sys.__stderr__ = stdout, stderr  # no terminal size to find, as behind a pipe
        os.environ.clear()
        os.environ.update({**self.env, **(extra_env or {})})
        os.chdir(cwd or self.cwd)
        get_settings.cache_clear()
        try:
            try:
                code = main(list(args))
            except SystemExit as exit_:  # argparse's usage errors and --help
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            stdout.flush()
            stderr.flush()
        finally:
            sys.stdin, sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__ = saved_streams
            os.environ.clear()
            os.environ.update(saved_env)
            os.chdir(saved_cwd)
            get_settings.cache_clear()
            root = logging.getLogger()
            for handler in [h for h in root.handlers if h not in saved_handlers]:
                root.removeHandler(handler)  # a handler bound to the captured streams must not outlive them
        result = Result(code, out.getvalue().decode("utf-8"), err.getvalue().decode("utf-8"))
        for stream in (stdin, stdout, stderr):
            stream.close()
        return result
