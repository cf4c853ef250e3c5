"""`moonmind task status ID`: read back a task sent with `--no-wait` (or one whose wait timed out)."""

from __future__ import annotations

import argparse
import json
import sys


def register(groups: dict) -> None:
    p = groups["task"].add_parser(
        "status", help="the state of a queued task, and its result or error once it is done",
        description="Ask the Celery result backend about a task sent earlier (`rag index --execution queue --no-wait`, "
                    "`rag overlay upsert --execution queue --no-wait`, or a wait that timed out). Exit 0 when it "
                    "succeeded or is still pending/running; the task's own exit code when it failed.",
    )
    p.add_argument("task_id", help="the id the command printed")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(_handler=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    from ..errors import MoonmindError
    from ..settings import get_settings
    from ..transports.queue_client import task_status

    settings = get_settings()
    status = task_status(args.task_id, broker_url=settings.celery_broker_url, backend_url=settings.result_backend)
    if args.json:
        sys.stdout.write(json.dumps(status, indent=2) + "\n")
    else:
        line = f"{status['task_id']}: {status['state'].lower()}"
        if "progress" in status:
            line += f" ({status['progress'].get('done', 0)}/{status['progress'].get('total', 0)} files)"
        sys.stdout.write(line + "\n")
        if "result" in status:
            result = status["result"]
            shown = result["line"] if isinstance(result, dict) and isinstance(result.get("line"), str) else None
            sys.stdout.write((shown or json.dumps(result, indent=2)) + "\n")
    if "error" in status:
        err = status["error"]
        raise MoonmindError(err["code"], err["message"], err["action"])
    return 0
