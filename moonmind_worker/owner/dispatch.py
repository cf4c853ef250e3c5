"""Where an operation runs: on the box's owner when one serves the store, else in this process.

Why apart from `client.py`: the thin client only speaks the owner's protocol and imports nothing
heavy; running an operation here needs the operations themselves (`ops.py`), which need the
doctor's checks, which ask the owner through the client. Kept in one module, that was a cycle.
"""

from __future__ import annotations

from ..errors import MoonmindError
from .client import OwnerGone, find, scope_of

TYPE_CHECKING = False  # annotations only: like the thin client, this path imports no `typing`
if TYPE_CHECKING:
    from typing import Any

    from .client import Progress


#: How many owners one operation tries when each goes away before answering (a hand-over, a crash).
ATTEMPTS = 3
#: The operations that may create the store (ops.WRITES, named here: `ops` is imported only to run one here).
CREATES = frozenset({"index", "overlay_upsert", "overlay_clean", "sync_embedding"})


def execute(
    settings: Any, op: str, args: dict[str, Any], *, collection: str | None = None,
    progress: Progress | None = None, timeout_s: float | None = None, start_owner: bool = True,
) -> Any:
    """Run `op` on the box's owner when one is alive, else in this process (`ops.run`).

    The answer is the same JSON either way, so a command prints it the same way. An owner that
    goes away before answering (it handed the store over, or died) is replaced by the next one:
    every operation is idempotent, so it is sent again. `start_owner=False`: an operation that
    does not need the store (enqueueing a Celery task) uses a live owner but never starts one.
    """
    gone = None
    for _ in range(ATTEMPTS):
        owner = find(settings, collection, start=start_owner, creates=op in CREATES)
        if owner is None:
            break
        pid = owner.pid
        try:
            return _call(owner, settings, op, args, progress, timeout_s)
        except OwnerGone:
            gone = pid
    if gone is not None:
        from ..entry import note

        note(f"the store's owner (PID {gone}) went away during {op}; running it in this process instead")
    from .. import runtime
    from .ops import run

    try:
        return run(op, args, settings, progress=progress)
    except MoonmindError as err:
        # the store was held by an owner still starting (another command's auto owner): now that it listens, use it
        owner = find(settings, collection, start=False) if err.code == "store_busy" else None
        if owner is None:
            raise
        return _call(owner, settings, op, args, progress, timeout_s)
    finally:
        runtime.let_go_unless_serving()


def _call(owner: Any, settings: Any, op: str, args: dict[str, Any], progress: Any, timeout_s: float | None) -> Any:
    return owner.call(op, args, scope=scope_of(settings), settings=settings.wire(), progress=progress, timeout_s=timeout_s)
