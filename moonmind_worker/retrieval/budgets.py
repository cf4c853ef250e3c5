"""Token and latency budgets: one set of rules for every transport.

Why one module: the CLI (direct), the gateway and the CLI's client-side check of
a gateway answer must agree on when a request is refused, when a pack is
trimmed, and what telemetry says; this module imports nothing heavy, so the
gateway client can use it without loading numpy or qdrant.

Token budget (`budgets.tokens`, counted like `usage.tokens`: the items' tokens,
~4 characters per token):
    one_item  = ceil(chunk_chars / 4)               # the largest chunk the indexer writes
    query     = ceil(len(query) / 4)
    worst     = top_k * one_item + query            # the largest pack the request can produce
    minimum   = one_item + query                    # room for the query and one full-size chunk
budget >= worst: nothing can need trimming. minimum <= budget < worst: retrieve,
then drop whole lowest-ranked items until usage.tokens <= budget (`truncated`).
budget < minimum: refused before any embedding or search (413), because not even
one full-size chunk fits. So a typical request (tokens=1200, top_k=8, chunk 1500
chars: worst 3000+, minimum ~380) is accepted and trimmed, not refused.

Latency budget (`budgets.latency_ms`): a deadline on the monotonic clock, handed
to the embedder and the store (they bound their own waits by it); crossing it
raises 408 with the latency actually spent.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..errors import MoonmindError

if TYPE_CHECKING:  # pragma: no cover
    from ..contracts import Budgets, ContextItem

CHARS_PER_TOKEN = 4


def tokens_for_chars(chars: int) -> int:
    return (chars + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def estimate_pack_tokens(query: str, top_k: int, chunk_chars: int) -> tuple[int, int]:
    """(minimum, worst case) tokens a request needs: see the module docstring."""
    one_item, q = tokens_for_chars(chunk_chars), tokens_for_chars(len(query))
    return one_item + q, top_k * one_item + q


def budget_tags(budget_type: str, limit: int | float | None, spent: int | float) -> dict[str, Any]:
    """The telemetry tags both transports log for a budget decision."""
    return {"budget_type": budget_type, "budget_limit": limit, "budget_spent": spent}


def precheck_tokens(query: str, top_k: int, chunk_chars: int, budgets: "Budgets | None") -> None:
    """Refuse (413) before any work when the token budget cannot hold even one full-size chunk."""
    if not budgets or not budgets.tokens:
        return
    minimum, worst = estimate_pack_tokens(query, top_k, chunk_chars)
    if budgets.tokens < minimum:
        raise MoonmindError(
            "token_budget_exceeded",
            f"Token budget {budgets.tokens} cannot hold one {chunk_chars}-character chunk plus the query "
            f"(~{minimum} tokens needed; the full top_k={top_k} pack could need ~{worst}).",
            f"Raise budgets.tokens to at least {minimum} (--budget tokens={minimum}), or shorten the query.",
            usage={"tokens": 0, "latency_ms": 0.0},
            tokens=minimum,
            **budget_tags("tokens", budgets.tokens, minimum),
        )


def trim_to_tokens(items: list["ContextItem"], budget: int) -> tuple[list["ContextItem"], bool]:
    """Keep the best-ranked items whose tokens fit the budget; whole items only, order kept."""
    kept: list[ContextItem] = []
    total = 0
    for item in items:
        if total + item.token_count > budget:
            return kept, True
        kept.append(item)
        total += item.token_count
    return kept, False


def check_trimmed(items_before: int, kept: list["ContextItem"], first_tokens: int, budgets: "Budgets", latency_ms: float) -> None:
    """413 when retrieval found items but not even the best one fits (a chunk larger than chunk_chars predicted)."""
    if items_before and not kept:
        raise MoonmindError(
            "token_budget_exceeded",
            f"Token budget {budgets.tokens} is smaller than the best-ranked item ({first_tokens} tokens).",
            f"Raise budgets.tokens to at least {first_tokens}.",
            usage={"tokens": 0, "latency_ms": latency_ms},
            tokens=first_tokens,
            **budget_tags("tokens", budgets.tokens, first_tokens),
        )


class Deadline:
    """A latency budget as an absolute time.monotonic() deadline, started when the request started."""

    def __init__(self, latency_ms: int | None, started: float | None = None) -> None:
        self.started = time.monotonic() if started is None else started
        self.limit_ms = latency_ms
        self.at = self.started + latency_ms / 1000 if latency_ms else None

    def elapsed_ms(self) -> float:
        return round((time.monotonic() - self.started) * 1000, 2)

    def remaining_s(self) -> float | None:
        return None if self.at is None else self.at - time.monotonic()

    def expired(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def exceeded(self, stage: str, tokens: int = 0) -> MoonmindError:
        spent = self.elapsed_ms()
        return MoonmindError(
            "latency_budget_exceeded",
            f"Latency budget of {self.limit_ms} ms exceeded while {stage}: spent {spent:.0f} ms.",
            "Raise budgets.latency_ms, narrow the filters, or retry when the service is less loaded.",
            latency_ms=spent,
            usage={"tokens": tokens, "latency_ms": spent},
            **budget_tags("latency_ms", self.limit_ms, spent),
        )

    def check(self, stage: str) -> None:
        if self.expired():
            raise self.exceeded(stage)


def fit_tokens(items: list["ContextItem"], budgets: "Budgets | None", deadline: "Deadline",
               notes: list[str]) -> tuple[list["ContextItem"], bool]:
    """The ranked items within the token budget (the lowest-ranked dropped first), saying what was dropped."""
    if not (budgets and budgets.tokens):
        return items, False
    kept, truncated = trim_to_tokens(items, budgets.tokens)
    check_trimmed(len(items), kept, items[0].token_count if items else 0, budgets, deadline.elapsed_ms())
    if truncated:
        notes.append(f"dropped {len(items) - len(kept)} lowest-ranked item(s) to fit the token budget of {budgets.tokens}")
    return kept, truncated
