"""Crash injection at store write points, for the adversarial suite (tests/adversarial/).

Why a hook and not sleep-and-kill: a kill at a random moment lands where the process spends
its time (embedding), rarely between two writes, which is exactly where a torn index comes
from. With ``MOONMIND_FAULT=<op>#<n>:<before|after>`` the process exits at once (``os._exit``:
no ``finally``, no flush, as a SIGKILL or a power cut would) just before or just after the n-th
call of store write `op`; ``MOONMIND_FAULT_TRACE=<file>`` appends every write's name to a file,
so a test can enumerate every write point of a real run. Unset (always, outside tests), the
store is returned untouched and this module is never imported.
"""

from __future__ import annotations

import os
from typing import Any

#: Every method of the Store protocol that changes what is stored.
WRITES = ("create", "upsert", "delete", "delete_ids", "set_metadata", "write_term_table", "write_file_table", "optimize",
          "flush", "switch_alias", "drop_physical")
#: The exit status of an injected crash (distinct from every documented exit code).
CRASH_EXIT = 86


def wrap(store: Any) -> Any:
    """`store` with its writes counted, traced and (at the planned one) crashed."""
    spec = os.environ.get("MOONMIND_FAULT", "")
    trace = os.environ.get("MOONMIND_FAULT_TRACE")
    plan = None
    if spec:
        target, _, when = spec.partition(":")
        op, _, n = target.partition("#")
        if op not in WRITES or not n.isdigit() or when not in ("before", "after"):
            raise ValueError(f"MOONMIND_FAULT={spec!r}: expected <op>#<n>:<before|after>, op among {', '.join(WRITES)}")
        plan = (op, int(n), when)
    return _Crashing(store, plan, trace)


class _Crashing:
    def __init__(self, store: Any, plan: tuple[str, int, str] | None, trace: str | None) -> None:
        self._store, self._plan, self._trace = store, plan, trace
        self._counts: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name not in WRITES:
            return attr

        def write(*args: Any, **kwargs: Any) -> Any:
            n = self._counts[name] = self._counts.get(name, 0) + 1
            if self._trace:
                with open(self._trace, "a") as f:
                    f.write(f"{name}\n")
            self._maybe_crash(name, n, "before")
            result = attr(*args, **kwargs)
            self._maybe_crash(name, n, "after")
            return result

        return write

    def _maybe_crash(self, op: str, n: int, when: str) -> None:
        if self._plan == (op, n, when):
            os._exit(CRASH_EXIT)
