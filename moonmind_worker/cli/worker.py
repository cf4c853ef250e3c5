"""`moonmind worker doctor`: the checklist a worker runs on boot."""

from __future__ import annotations

import argparse
import json
import sys

from ..text.terminal import printable


def register(groups: dict) -> None:
    worker = groups["worker"]
    p = worker.add_parser("doctor", help="check that retrieval works here: credentials, Qdrant, collection, model")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(_handler=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """One ✓/✗ line per check on stdout; exit 0 only when retrieval is usable."""
    from ..jobs.doctor import run_checks
    from ..settings import get_settings

    report = run_checks(get_settings())
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(printable(report.render()))
    return report.exit_code
