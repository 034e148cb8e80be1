"""System checks: fail loudly when the tokenizer vocabularies are missing or corrupt.

Without them tiktoken tries to download its files, which fails offline with a
confusing network error in the middle of a request.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register

from contextlab.engine.core.tokens import verify_vocabularies


@register()
def check_tiktoken_vocabularies(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    problems = verify_vocabularies(settings.TIKTOKEN_DIR)
    return [
        Error(
            problem,
            hint="run `python scripts/install_tiktoken_data.py` to install the vocabularies",
            id="contextlab.E001",
        )
        for problem in problems
    ]


@register()
def check_providers(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """The operator's provider list must read, or every summary call would fail later."""
    from contextlab.support import providers

    try:
        providers.configured()
    except providers.ProvidersMisconfigured as exc:
        return [Error(str(exc), hint='e.g. {"openai": {"base_url": "https://api.openai.com/v1", '
                                     '"api_key_env": "OPENAI_API_KEY"}}', id="contextlab.E002")]
    return []
