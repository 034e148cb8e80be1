"""examples/unmodified_agent.py, unchanged, behind the gateway: only base_url and the key differ."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from contextlab.gateway.models import GatewayExchange
from contextlab.sessions.models import AgentSession
from tests.gateway.provider import Answer, scripted

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "unmodified_agent.py"
CAUSE = "cart.c calls tax_rate(), which tax.c renamed to vat_rate(); call vat_rate() instead."


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unmodified_agent", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _brain():
    """What a model would do with the task: look around, read, build, answer."""
    return scripted(
        Answer(content=None, tool_calls=[("list_files", {})]),
        Answer(content="Reading the sources.", tool_calls=[("read_file", {"path": "src/cart.c"}),
                                                           ("read_file", {"path": "src/tax.c"})]),
        Answer(content=None, tool_calls=[("run_shell", {"command": "make release"})]),
        Answer(CAUSE),
    )


@pytest.mark.parametrize("stream", [False, True])
def test_it_runs_the_unmodified_agent_through_the_gateway(gateway_url, alice_token, upstream, provider, capsys,
                                                          stream):
    provider.responder = _brain()
    argv = ["--base-url", gateway_url, "--api-key", alice_token, "--model", "gpt-4o"] + (["--stream"] if stream else [])
    assert _example().main(argv) == 0
    assert capsys.readouterr().out.strip() == CAUSE

    session = AgentSession.objects.get()
    assert session.turns_count == 4
    assert list(session.messages.order_by("seq").values_list("role", flat=True)) == \
        ["user", "assistant", "tool", "assistant", "tool", "tool", "assistant", "tool", "assistant"]
    assert list(GatewayExchange.objects.order_by("created").values_list("identity", "managed")) == \
        [("new", True)] + [("continued", True)] * 3
    # The tools' output reached the provider paired with the calls.
    last = provider.chat_requests[-1].body["messages"]
    assert "undefined reference to `tax_rate'" in last[-1]["content"]
    assert last[-2]["tool_calls"][0]["function"]["name"] == "run_shell"


def test_it_is_the_same_script_that_talks_to_the_provider_directly(provider, capsys):
    provider.responder = _brain()
    assert _example().main(["--base-url", provider.base_url, "--api-key", "sk-direct"]) == 0
    assert capsys.readouterr().out.strip() == CAUSE
    assert "unmodified_agent" not in sys.modules
