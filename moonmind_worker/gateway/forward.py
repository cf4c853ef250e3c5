"""A gateway request run by the box's owner when one serves the store (a worker, `moonmind serve`)."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

T = TypeVar("T")


def via_box_owner(resources: Any, call: Callable[[Any], T]) -> T | None:
    """`call(owner)` on the box's owner, replaced once if it goes away mid-request; None when none serves the store."""
    from ..owner.client import OwnerGone

    for _ in range(2):  # an owner that goes away mid-request (it stopped) is replaced once
        owner = resources.box_owner()
        if owner is None:
            return None
        try:
            return call(owner)
        except OwnerGone:
            continue
    return None
