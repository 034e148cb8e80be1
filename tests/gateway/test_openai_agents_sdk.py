"""The OpenAI Agents SDK on its default path (the Responses API) through the gateway, unmodified.

Only the client's base URL and key point at ContextLab; the SDK's tracing, which
would export to OpenAI, is switched off.
"""

from __future__ import annotations

import json

import pytest
from openai import AsyncOpenAI

from contextlab.gateway.models import ObservedCall, UpstreamProvider
from contextlab.sessions import services
from contextlab.support import providers
from tests.gateway.responses_upstream import Reply, Request, ResponsesUpstream, function_call, text

agents = pytest.importorskip("agents")


def brain(request: Request) -> Reply:
    items = request.body["input"]
    if items[-1].get("type") == "function_call_output":
        return Reply([text(f"It is {json.loads(items[-1]['output'])['celsius']} degrees in Oslo.")])
    return Reply([function_call("get_weather", {"city": "Oslo"})])


def test_it_runs_an_agents_sdk_agent_with_a_tool_through_the_gateway(gateway_url, alice_token, alice):
    profile = services.profile_create(owner=alice, name="agents", knobs={"max_input_length": 100_000})

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return json.dumps({"city": city, "celsius": -3})

    with ResponsesUpstream(brain) as upstream:
        UpstreamProvider.objects.create(profile=profile, base_url=upstream.base_url, timeout=30,
                                        mode=UpstreamProvider.Mode.OBSERVE,
                                        api_key=providers.encrypt_secret("sk-upstream"))
        agents.set_tracing_disabled(True)
        # The SDK's default client and its default model API (Responses), as a user sets them up.
        agents.set_default_openai_client(AsyncOpenAI(base_url=gateway_url, api_key=alice_token, max_retries=0),
                                         use_for_tracing=False)
        agent = agents.Agent(name="weather", instructions="Answer weather questions with the tool.",
                             tools=[get_weather], model="gpt-5")
        result = agents.Runner.run_sync(agent, "What is the weather in Oslo?")
    assert result.final_output == "It is -3 degrees in Oslo."
    calls = list(ObservedCall.objects.order_by("pk"))
    assert [c.endpoint for c in calls] == ["responses", "responses"]
    assert calls[0].reply_tool_calls[0]["function"]["name"] == "get_weather"
    assert calls[0].session == calls[1].session is not None
    contents = json.dumps([m.content for m in calls[1].session.messages.all()])
    assert "Oslo" in contents and '\\"celsius\\": -3' in contents
