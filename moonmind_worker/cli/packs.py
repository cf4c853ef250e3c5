"""`moonmind rag packs`: the context packs cached for a run (what a dashboard shows as "Context used")."""

from __future__ import annotations

import argparse
import json
import sys

from ..text.terminal import printable


def register(groups: dict) -> None:
    p = groups["rag"].add_parser("packs", help="list the context packs cached for a run")
    p.add_argument("--run-id", default=None, help="run whose packs to list (default: MOONMIND_RUN_ID, else 'adhoc')")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.add_argument("--prune", action="store_true",
                   help="delete every run's packs older than MOONMIND_ARTIFACTS_RETENTION_DAYS (the beat sweep does this too)")
    p.set_defaults(_handler=cmd_packs)


def cmd_packs(args: argparse.Namespace) -> int:
    from ..observe import list_packs, packs_dir
    from ..settings import get_settings
    from .main import note

    settings = get_settings()
    if args.prune:
        from ..observe import prune_artifacts

        removed = prune_artifacts(settings)
        days = settings.artifacts_retention_days
        if args.json:
            sys.stdout.write(json.dumps({"runs_pruned": removed, "retention_days": days}) + "\n")
        else:
            sys.stdout.write(f"pruned {removed} run(s) with no search in {days:g} days\n" if days
                             else "retention is off (MOONMIND_ARTIFACTS_RETENTION_DAYS=0): nothing pruned\n")
        return 0
    from ..job_scope import within

    run_id = within(settings, "run_id", args.run_id, "listing the packs of") or settings.run_id
    packs = list_packs(run_id, settings)
    if args.json:
        sys.stdout.write(json.dumps(packs, indent=2) + "\n")
        return 0
    if not packs:
        note(f"no context packs cached for run {run_id or 'adhoc'} (looked in {packs_dir(run_id, settings)})")
        return 0
    for p in packs:
        sources = ", ".join(p["sources"]) or "(no hits)"
        line = f"{p['telemetry_id']}  {p['retrieved_at']}  {p['hits']} hits  {p['query']!r}"
        sys.stdout.write(f"{printable(line, single_line=True)}\n    {printable(sources, single_line=True)}\n")
    return 0
