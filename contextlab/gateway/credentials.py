"""Who is calling, from the headers the agent CLIs can send, for every wire protocol.

An agent authenticates to ContextLab with a ContextLab API token, in one of:

- ``X-ContextLab-Token`` (the dedicated header; Claude Code sets it with
  ``ANTHROPIC_CUSTOM_HEADERS``, Codex with ``http_headers``): then whatever the
  client sends as ``x-api-key`` or ``Authorization`` is its own provider
  credential (a user's Anthropic/OpenAI key or subscription token);
- ``x-api-key`` (Claude Code's ``ANTHROPIC_API_KEY``, the anthropic SDKs);
- ``Authorization: Bearer`` (Claude Code's ``ANTHROPIC_AUTH_TOKEN``, the OpenAI SDKs).

Without the dedicated header, whichever of ``x-api-key`` and ``Authorization``
holds a valid ContextLab token is the token, and the other one (if any) is the
provider credential. Whether that credential goes upstream is the provider's
setting (``UpstreamProvider.credential``), not the client's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from contextlab.api.models import ApiToken
from contextlab.gateway import services

TOKEN_HEADER = "X-ContextLab-Token"
# Credentials longer than this are no key or token anyone issues: not looked up.
MAX_CREDENTIAL_CHARS = 4096


@dataclass(frozen=True)
class ClientCredential:
    """The client's own provider credential, as the header it came in (to forward it as it came)."""

    header: str  # "x-api-key" or "Authorization"
    value: str

    def __repr__(self) -> str:  # never in a log line
        return f"ClientCredential({self.header}, ****)"


@dataclass(frozen=True)
class Credentials:
    token: ApiToken | None
    provider_credential: ClientCredential | None


def _bearer(value: str) -> str:
    scheme, _, rest = value.strip().partition(" ")
    return rest.strip() if scheme.lower() == "bearer" else ""


def _token(value: str) -> ApiToken | None:
    if not value or len(value) > MAX_CREDENTIAL_CHARS:
        return None
    return services.token_for(f"Bearer {value}")


def resolve(headers: Mapping[str, str]) -> Credentials:
    """(the ContextLab token or None, the client's provider credential or None) from the request headers."""
    api_key = (headers.get("x-api-key") or "").strip()
    authorization = (headers.get("Authorization") or "").strip()
    sent: list[tuple[ClientCredential, str]] = []
    if api_key:
        sent.append((ClientCredential("x-api-key", api_key), api_key))
    if authorization:
        sent.append((ClientCredential("Authorization", authorization), _bearer(authorization)))
    dedicated = (headers.get(TOKEN_HEADER) or "").strip()
    if dedicated:
        dedicated_value = _bearer(dedicated) or dedicated
        token = _token(dedicated_value)
        # A client may send its ContextLab token in more than one header: never take it for
        # the client's own provider key, or the provider would see it.
        own = [credential for credential, value in sent if value != dedicated_value and _token(value) is None]
        return Credentials(token, own[0] if own else None)
    for index, (_, value) in enumerate(sent):
        token = _token(value)
        if token is not None:
            others = [credential for i, (credential, other) in enumerate(sent)
                      if i != index and other != value and _token(other) is None]
            return Credentials(token, others[0] if others else None)
    return Credentials(None, sent[0][0] if sent else None)
