"""Same query, same index, same output: `rag search` markdown and JSON, saved or compared.

`python -m bench.same_output --home H --save DIR` runs a fixed set of one-shot searches (no
owner) on the index under H and writes each one's stdout and stderr; `--compare DIR` runs them
again and diffs against what was saved, byte for byte. `--moonmind PATH` picks the executable,
so the code before a change (another checkout's venv) and after it run on one index.

Only the fields that differ on every call are masked in the JSON: `retrieved_at`,
`telemetry_id` and `usage.latency_ms`. The markdown (the default output) is compared whole.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from .owner import MOONMIND, QUERIES, env_for

#: (name, extra arguments): the bench's queries plus flags that take other paths through the pipeline.
CASES: list[tuple[str, list[str]]] = [(f"q{n:02d}", ["--query", q]) for n, q in enumerate(QUERIES)] + [
    ("symbol", ["--query", "get_connection"]),
    ("camel", ["--query", "HttpResponseRedirect permanent"]),
    ("top3", ["--query", "cache backend", "--top-k", "3"]),
    ("top20", ["--query", "form field validation", "--top-k", "20"]),
    ("threshold", ["--query", "url routing", "--score-threshold", "0.5"]),
    ("no-match-threshold", ["--query", "url routing", "--score-threshold", "0.99"]),
    ("repo-filter", ["--query", "signals", "--filters", "repo=django"]),
    ("repo-typo", ["--query", "signals", "--filters", "repo=djangoo"]),
    ("path-filter", ["--query", "timezone", "--filters", "path=django/utils/timezone.py"]),
    ("language", ["--query", "admin changelist", "--filters", "language=javascript"]),
    ("tokens", ["--query", "session middleware", "--budget", "tokens=600"]),
    ("long", ["--query", "how does the ORM " * 80]),
    ("unicode", ["--query", "übersetzung gettext 翻訳"]),
    ("bad-filter", ["--query", "x", "--filters", "nokey"]),
]

_MASKED = {"retrieved_at": "<time>", "telemetry_id": "<id>"}


def run_case(moonmind: str, env: dict[str, str], args: list[str]) -> dict[str, str]:
    """stdout/stderr of the markdown and the JSON form of one search, volatile JSON fields masked."""
    out = {}
    for form, extra in (("md", []), ("json", ["--json"])):
        p = subprocess.run([moonmind, "rag", "search", *args, *extra], env=env, capture_output=True, text=True, timeout=300)
        stdout = p.stdout
        if form == "json" and p.returncode == 0:
            data = json.loads(stdout)
            data.update({k: v for k, v in _MASKED.items() if k in data})
            data["usage"]["latency_ms"] = "<ms>"
            stdout = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
        stderr = re.sub(r"\d+(\.\d+)? ?ms", "<ms>", p.stderr) if form == "json" else p.stderr
        out[f"{form}.out"] = stdout
        out[f"{form}.err"] = f"exit {p.returncode}\n{stderr}"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.same_output", description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True, help="an indexed MOONMIND_HOME (no owner running on it)")
    ap.add_argument("--moonmind", default=MOONMIND, help="the moonmind executable to run (default: this venv's)")
    ap.add_argument("--only", nargs="+", metavar="CASE", help="run only these cases (default: all)")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", metavar="DIR", help="write every output under DIR")
    mode.add_argument("--compare", metavar="DIR", help="diff every output against DIR")
    args = ap.parse_args(argv)
    env = env_for(Path(args.home))
    env["MOONMIND_OWNER"] = "off"
    differ = 0
    cases = [(n, c) for n, c in CASES if not args.only or n in args.only]
    for name, case in cases:
        outputs = run_case(args.moonmind, env, case)
        for part, text in outputs.items():
            path = Path(args.save or args.compare) / f"{name}.{part}"
            if args.save:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                continue
            saved = path.read_text(encoding="utf-8")
            if saved != text:
                differ += 1
                sys.stdout.writelines(difflib.unified_diff(saved.splitlines(True), text.splitlines(True), str(path), "now", n=1))
    if args.save:
        print(f"saved {len(cases)} searches x 2 forms under {args.save}")
    else:
        print(f"{len(cases)} searches x 2 forms: {differ} output(s) differ" if differ else
              f"{len(cases)} searches x 2 forms (stdout and stderr): byte-identical")
    return 1 if differ else 0


if __name__ == "__main__":
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    raise SystemExit(main())
