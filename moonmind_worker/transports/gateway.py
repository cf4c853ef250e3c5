"""The RetrievalGateway transport: one POST (`gateway_client.fetch_pack`), the pack cached for this run."""

from __future__ import annotations

from ..errors import MoonmindError
from .gateway_client import FALLBACK_CODES  # noqa: F401 - the codes `transports.search` falls back on

TYPE_CHECKING = False  # annotations only: the thin client's path imports no `typing` (see cli/main.py)
if TYPE_CHECKING:
    from typing import Any


class GatewayTransport:
    name = "gateway"

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def search(self, request: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        from ..contracts import parse_query
        from .gateway_client import fetch_pack

        settings = self.settings
        self._credentials()
        pack = fetch_pack(parse_query(request), url=settings.retrieval_url, token=settings.retrieval_token.get_secret_value())
        from ..observe import record_pack

        try:
            record_pack(pack, settings)  # "Context used" belongs to this worker's run, not to the gateway host
        except Exception:  # noqa: BLE001 - caching never fails a search
            pass
        return pack.model_dump(mode="json")

    def navigate(self, op: str, request: dict[str, Any]) -> dict[str, Any]:
        """POST /retrieval/related or /retrieval/symbols: the ContextPack or SymbolsResult JSON."""
        from ..contracts import parse_query
        from .gateway_client import fetch_navigation

        self._credentials()
        token = self.settings.retrieval_token.get_secret_value()
        return fetch_navigation(op, parse_query(request), url=self.settings.retrieval_url, token=token)

    def _credentials(self) -> None:
        """The URL and token a gateway call needs, or missing_credentials naming them."""
        if not self.settings.retrieval_url:
            raise MoonmindError(
                "missing_credentials",
                "--transport gateway needs MOONMIND_RETRIEVAL_URL (the RetrievalGateway's base URL).",
                "Export MOONMIND_RETRIEVAL_URL=https://gateway.example:8088, or use --transport direct.",
            )
        token = self.settings.retrieval_token
        if token is None or not token.get_secret_value():
            raise MoonmindError(
                "missing_credentials",
                "MOONMIND_RETRIEVAL_TOKEN is not set; the RetrievalGateway needs the worker's bearer token.",
                "Export MOONMIND_RETRIEVAL_TOKEN (ask the gateway operator: `moonmind gateway add-token`).",
            )
