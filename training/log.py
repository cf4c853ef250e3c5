"""The training scripts' progress lines, on stderr with the script's tag."""

from __future__ import annotations

import sys
from typing import Callable


def speaker(tag: str) -> Callable[[str], None]:
    """`say(msg)` writing `[tag] msg` to stderr at once (the scripts run for minutes)."""

    def say(msg: str) -> None:
        sys.stderr.write(f"[{tag}] {msg}\n")
        sys.stderr.flush()

    return say
