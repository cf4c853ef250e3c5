"""The CLI's gateway transport: one POST to the RetrievalGateway, the pack back.

Why stdlib urllib: a worker's `rag search` through the gateway must start fast
and needs no Qdrant, numpy or HTTP framework; this module imports only the
contracts (pydantic) and the budget rules.

The token travels only in the Authorization header; it is never part of a URL,
a message or an error. Budgets are enforced here too: the request is given up at
the latency budget (plus a short grace so the server's own 408 can arrive), a
slower answer is refused, and a pack over the token budget is trimmed with the
same rule as the pipeline.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from ..contracts import ContextPack, RetrievalQuery
from ..errors import CODES, MoonmindError, codes_that, redact
from ..retrieval.budgets import Deadline, budget_tags, trim_to_tokens

#: Timeout for a request without a latency budget.
DEFAULT_TIMEOUT_S = 30.0
#: Extra wait past the latency budget so the server's 408 (with its measured latency) can arrive.
GRACE_S = 0.25
#: Failures after which falling back to direct retrieval makes sense (the gateway, not the request, is the problem).
FALLBACK_CODES = codes_that("fallback")  # a column of errors.CODES


def context_url(base: str) -> str:
    return base.rstrip("/") + "/retrieval/context"


def _post(query: RetrievalQuery, endpoint: str, *, token: str, where: str, timeout: float,
          deadline: Deadline | None = None) -> bytes:
    """POST the query (as the gateway transport) to `endpoint`: the answer's bytes, or a MoonmindError."""
    body = query.model_copy(update={"transport": "gateway"}).model_dump_json(exclude_none=True).encode()
    request = urllib.request.Request(
        endpoint, data=body, method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 - operator-configured URL
            return resp.read()
    except urllib.error.HTTPError as exc:
        raise _from_http_error(exc, where) from None
    except (TimeoutError, OSError) as exc:
        timed_out = isinstance(exc, TimeoutError) or "timed out" in str(getattr(exc, "reason", exc))
        if timed_out and deadline is not None and deadline.at is not None:
            raise deadline.exceeded("waiting for the RetrievalGateway") from None
        raise MoonmindError(
            "retrieval_failed",
            f"Cannot reach the RetrievalGateway at {where} ({type(getattr(exc, 'reason', exc)).__name__}).",
            "Check MOONMIND_RETRIEVAL_URL and that the gateway is up (GET /retrieval/health).",
        ) from None


def fetch_pack(query: RetrievalQuery, *, url: str, token: str) -> ContextPack:
    """POST the query to the gateway; the pack, or the gateway's error as a MoonmindError."""
    budgets = query.budgets
    deadline = Deadline(budgets.latency_ms if budgets else None)
    timeout = budgets.latency_ms / 1000 + GRACE_S if budgets and budgets.latency_ms else DEFAULT_TIMEOUT_S
    where = redact(url, [token])
    raw = _post(query, context_url(url), token=token, where=where, timeout=timeout, deadline=deadline)
    try:
        pack = ContextPack.model_validate_json(raw)
    except ValueError:
        raise MoonmindError(
            "retrieval_failed",
            f"The RetrievalGateway at {where} answered with something that is not a ContextPack.",
            "Check that MOONMIND_RETRIEVAL_URL points at a MoonMind RetrievalGateway.",
        ) from None
    if deadline.at is not None and deadline.expired():
        raise deadline.exceeded("waiting for the RetrievalGateway", tokens=pack.usage.tokens)
    return enforce_token_budget(pack)


def enforce_token_budget(pack: ContextPack) -> ContextPack:
    """The client-side token check: a pack over budget is trimmed exactly as the pipeline would."""
    budgets = pack.budgets
    if not budgets or not budgets.tokens or pack.usage.tokens <= budgets.tokens:
        return pack
    from ..retrieval.context_pack import format_context_text

    items, _ = trim_to_tokens(pack.items, budgets.tokens)
    notes = [*pack.notes, f"trimmed client-side to the token budget of {budgets.tokens}"]
    if pack.next_cursor:  # it points past the items dropped here: paging on would skip them
        notes.append("no next page from this pack (it was trimmed here); search again with a larger token budget")
    return pack.model_copy(
        update={
            "next_cursor": None,
            "items": items,
            "context_text": format_context_text(items),
            "usage": pack.usage.model_copy(update={"tokens": sum(i.token_count for i in items)}),
            "truncated": True,
            "notes": notes,
        }
    )


_BY_STATUS = {401: "unauthenticated", 403: "forbidden", 400: "invalid_query", 408: "latency_budget_exceeded",
              413: "token_budget_exceeded"}


def _from_http_error(exc: urllib.error.HTTPError, where: str) -> MoonmindError:
    try:
        data = json.loads(exc.read() or b"{}")
        err = data["error"]
        code, message, action = str(err["code"]), str(err["message"]), str(err["action"])
    except (ValueError, KeyError, TypeError):
        # e.g. a proxy in front of the gateway: keep the status's meaning so a 401/403 never falls back
        code = _BY_STATUS.get(exc.code, "retrieval_failed")
        return MoonmindError(
            code,
            f"The RetrievalGateway at {where} answered HTTP {exc.code} without an error envelope.",
            "Check MOONMIND_RETRIEVAL_URL / MOONMIND_RETRIEVAL_TOKEN and any proxy in front of the gateway.",
        )
    if code not in CODES:
        return MoonmindError("retrieval_failed", f"Gateway error {code}: {message}", action)
    details: dict = {"http_status": exc.code}
    if isinstance(data.get("usage"), dict):
        details["usage"] = data["usage"]
    if isinstance(data.get("budget"), dict):
        b = data["budget"]
        details.update(budget_tags(b.get("budget_type"), b.get("budget_limit"), b.get("budget_spent")))
    return MoonmindError(code, message, action, **details)


#: The gateway path of each navigation operation (`transports.navigate`).
NAVIGATION_PATHS = {"related": "/retrieval/related", "symbols": "/retrieval/symbols"}


def fetch_navigation(op: str, query: RetrievalQuery, *, url: str, token: str) -> dict:
    """POST a related/symbols query to the gateway: its JSON answer, or the gateway's error as a MoonmindError."""
    where = redact(url, [token])
    raw = _post(query, url.rstrip("/") + NAVIGATION_PATHS[op], token=token, where=where, timeout=DEFAULT_TIMEOUT_S)
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise MoonmindError("retrieval_failed", f"The RetrievalGateway at {where} answered with something that is not JSON.",
                            "Check that MOONMIND_RETRIEVAL_URL points at a MoonMind RetrievalGateway.")
    return data
