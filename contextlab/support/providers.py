"""The upstream providers this server may call, as the operator declared them.

Which hosts the server sends requests to, and with which secret, is the
operator's decision, never a user's: ``CONTEXTLAB_PROVIDERS`` names each
provider with its base URL and the environment variable holding its key, and
a profile only picks one of those names. The variable's name never leaves
this module in anything a user reads.

Also here: keys a person types in (the gateway's stored provider keys) are
kept encrypted, and upstream error text is bounded before a user sees it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

from contextlab.engine.core.errors import InvalidProfile

# Longest upstream error text kept for a user (run errors, gateway records).
MAX_UPSTREAM_ERROR_CHARS = 300
# Longest error a run row keeps: our own sentence around at most one such text.
MAX_RUN_ERROR_CHARS = 1_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")


class ProviderUnavailable(InvalidProfile):
    """A profile names no provider, or one the operator does not (or no longer) offer."""


class ProvidersMisconfigured(ValueError):
    """``CONTEXTLAB_PROVIDERS`` cannot be read; raised when the settings load."""


@dataclass(frozen=True)
class Provider:
    name: str
    base_url: str
    api_key_env: str = ""

    def api_key(self) -> str:
        """The key to send to this provider only; "" sends none."""
        if not self.api_key_env:
            return ""
        value = os.environ.get(self.api_key_env, "").strip()
        if not value:
            # The variable's name is the operator's business: the log says it,
            # the user reads only that the provider has no key.
            raise ProviderUnavailable(
                f"the provider {self.name!r} has no API key configured on the server; ask the operator",
                field="compaction_provider")
        return value


def parse_providers(text: str) -> dict[str, Provider]:
    """``{"name": {"base_url": "https://…/v1", "api_key_env": "VAR"}, …}`` as JSON, or "" for none."""
    if not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ProvidersMisconfigured(f"CONTEXTLAB_PROVIDERS is not JSON: {exc}") from exc
    return providers_from(raw)


def providers_from(raw: Any) -> dict[str, Provider]:
    if not isinstance(raw, dict):
        raise ProvidersMisconfigured("CONTEXTLAB_PROVIDERS must be an object: name -> {base_url, api_key_env}")
    providers: dict[str, Provider] = {}
    for name, entry in raw.items():
        if isinstance(entry, Provider):
            providers[name] = entry
            continue
        if not isinstance(name, str) or not _NAME.match(name):
            raise ProvidersMisconfigured(f"provider name {name!r}: letters, digits, '_', '.', '-' (64 at most)")
        if not isinstance(entry, dict) or set(entry) - {"base_url", "api_key_env"}:
            raise ProvidersMisconfigured(f"provider {name!r}: an object with base_url and api_key_env")
        base_url = entry.get("base_url")
        if not isinstance(base_url, str):
            raise ProvidersMisconfigured(f"provider {name!r}: base_url must be an http(s) URL")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ProvidersMisconfigured(f"provider {name!r}: base_url must be an http(s) URL")
        key_env = entry.get("api_key_env") or ""
        if not isinstance(key_env, str) or (key_env and not _ENV_NAME.match(key_env)):
            raise ProvidersMisconfigured(f"provider {name!r}: api_key_env must name an environment variable")
        providers[name] = Provider(name=name, base_url=base_url.rstrip("/"), api_key_env=key_env)
    return providers


def configured() -> dict[str, Provider]:
    """The operator's providers, by name (settings may hold the JSON text or its object)."""
    value = getattr(settings, "CONTEXTLAB_PROVIDERS", {})
    return parse_providers(value) if isinstance(value, str) else providers_from(value)


def provider_named(name: str) -> Provider:
    if not name:
        raise ProviderUnavailable("the openai compactor needs a compaction_provider: one of "
                                  + _offered(), field="compaction_provider")
    found = configured().get(name)
    if found is None:
        raise ProviderUnavailable(f"unknown compaction_provider {name!r}; this server offers " + _offered(),
                                  field="compaction_provider")
    return found


def _offered() -> str:
    names = sorted(configured())
    return ", ".join(repr(n) for n in names) if names else "none (the operator has configured no provider)"


def provider_choices() -> list[tuple[str, str]]:
    return [("", "none")] + [(p.name, f"{p.name} ({urlsplit(p.base_url).netloc})")
                             for p in configured().values()]


def bounded_upstream_text(text: str, *, limit: int = MAX_UPSTREAM_ERROR_CHARS) -> str:
    """Upstream text a user may read: one line of printable characters, cut to ``limit``."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# -- keys stored in the database ----------------------------------------------------------------
_PREFIX = "fernet:"  # also in gateway migration 0002


def _fernet() -> Fernet:
    secret = getattr(settings, "CONTEXTLAB_SECRETS_KEY", "") or settings.SECRET_KEY
    digest = hashlib.sha256(b"contextlab stored secrets\0" + secret.encode("utf-8")).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def encrypt_secret(value: str) -> str:
    """What the database stores for a key a person entered ("" stays "")."""
    if not value:
        return ""
    return _PREFIX + _fernet().encrypt(value.encode("utf-8")).decode("ascii")


def decrypt_secret(stored: str) -> str:
    """The key back; a value stored before encryption existed is returned as it is."""
    if not stored.startswith(_PREFIX):
        return stored
    try:
        return _fernet().decrypt(stored[len(_PREFIX):].encode("ascii")).decode("utf-8")
    except InvalidToken as exc:
        raise ProviderUnavailable("a stored provider key cannot be read (the server's secret key changed); "
                                  "enter the key again", field="api_key") from exc
