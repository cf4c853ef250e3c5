"""`moonmind job start|finish --manifest FILE`: the job hook for runners outside Celery."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from ..errors import MoonmindError
from ..text.terminal import printable


def register(groups: dict) -> None:
    job = groups["job"]

    p = job.add_parser("start", help="resolve job.capabilities.rag, run doctor checks, print the RAG banner")
    p.add_argument("--manifest", required=True, help="job manifest JSON (updated in place)")
    p.add_argument("--env-file", default=None, help="also write `export MOONMIND_JOB_ID=…` lines for the job's shell")
    p.add_argument("--json", action="store_true", help="print the updated manifest as JSON instead of the banner")
    p.set_defaults(_handler=cmd_start)

    p = job.add_parser("finish", help="remove the run's overlay (through the store's owner, else queued) and emit job_rag_finished")
    p.add_argument("--manifest", required=True, help="job manifest JSON (updated in place)")
    p.add_argument("--outcome", default="success", help="how the job ended (success, failure, …)")
    p.add_argument("--json", action="store_true", help="print the updated manifest as JSON")
    p.set_defaults(_handler=cmd_finish)


def read_manifest(path: str) -> dict:
    from ..text.files import Unreadable, read_regular

    try:
        data = json.loads(read_regular(path, 16 << 20)[0].decode("utf-8"))
    except FileNotFoundError:
        raise MoonmindError("invalid_argument", f"Manifest {path} does not exist.", "Pass the job manifest file with --manifest.") from None
    except Unreadable as exc:
        raise MoonmindError("invalid_argument", f"Manifest {path} was not read: {exc}.",
                            "Pass the job manifest file with --manifest.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MoonmindError("invalid_argument", f"Manifest {path} is not valid JSON ({exc.__class__.__name__}).",
                            "Fix the manifest file.") from None
    if not isinstance(data, dict):
        raise MoonmindError("invalid_argument", f"Manifest {path} is not a JSON object.",
                            "The manifest must be an object with job_id, run_id, …")
    return data


def write_manifest(path: str, manifest: dict) -> None:
    from .main import write_atomic

    write_atomic(path, json.dumps(manifest, indent=2) + "\n")


def cmd_start(args: argparse.Namespace) -> int:
    from ..entry import default_root
    from ..jobs.hook import BANNER, job_of, start_job
    from ..settings import get_settings
    from .main import note

    manifest = read_manifest(args.manifest)
    blocked: MoonmindError | None = None
    try:
        # the job's tree: the git work tree it starts in (the manifest's "workspace" names another)
        start_job(manifest, settings=get_settings(), workspace=default_root())
    except MoonmindError as err:
        if err.code != "job_blocked":
            raise
        blocked = err
    write_manifest(args.manifest, manifest)  # the reason is recorded even when the job is blocked
    rag = job_of(manifest)["rag"]
    if args.env_file:
        from .main import write_atomic

        lines = [f"export {k}={shlex.quote(v)}" for k, v in rag["environment"].items()]
        write_atomic(args.env_file, "\n".join(lines) + ("\n" if lines else ""))
    if blocked is not None:
        raise blocked
    if args.json:
        sys.stdout.write(json.dumps(manifest, indent=2) + "\n")
    elif rag["available"]:
        sys.stdout.write(BANNER + "\n")
    else:
        note(f"RAG unavailable: {rag['reason']}; remedy: {rag['remedy']}")
    return 0


def cmd_finish(args: argparse.Namespace) -> int:
    from ..jobs.hook import finish_job, job_of
    from ..settings import get_settings
    from .main import note

    manifest = read_manifest(args.manifest)
    finish_job(manifest, settings=get_settings(), outcome=args.outcome)
    write_manifest(args.manifest, manifest)
    clean = job_of(manifest)["rag"]["overlay_clean"]
    if args.json:
        sys.stdout.write(json.dumps(manifest, indent=2) + "\n")
    elif "task_id" in clean:
        sys.stdout.write(printable(f"overlay clean for run {clean['run_id']} queued: {clean['task_id']}", single_line=True) + "\n")
    elif "removed" in clean:
        sys.stdout.write(printable(f"removed {clean['removed']} overlay points of run {clean['run_id']}", single_line=True) + "\n")
    else:
        note(f"overlay clean not queued: {clean.get('message') or clean.get('skipped')}")
    return 0
