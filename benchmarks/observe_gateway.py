"""What recording a call costs the observe-mode gateway as an agent's run grows (the shared CoPaw run).

The 75 requests of the real CoPaw 1.0.2 run go through the gateway in observe
mode (Django's test client, SQLite, a local provider answering what CoPaw got),
twice, each time under a profile of its own:

* **kept**: as served, the process keeps each profile's inference, feeds it
  only the new call and writes only the message rows that changed;
* **rebuilt**: the kept inference is dropped before every call, so each call
  reads and infers every call before it again and writes every row of the
  session again (what every call did before, and what a process that did not
  record the previous call still does once).

Printed: the median time of recording a call (the database work and the session
rewrite, in the client's wait) for calls 1-10, 31-40 and 66-75 of the run, and
the whole run's total. What still grows with the run in "kept" is deriving every
message row from every request before comparing them with the rows written.

Run: ``.venv/bin/python benchmarks/observe_gateway.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import isolated_django  # noqa: E402


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="contextlab-observe-gateway-"))
    try:
        isolated_django.setup(folder)
        _run()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run() -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    from contextlab.api.models import ApiToken
    from contextlab.gateway import observe
    from contextlab.gateway.models import UpstreamProvider
    from contextlab.sessions.models import AgentProfile
    from tests.gateway.provider import Answer, Provider
    from tests.observed.copaw import recorded_requests

    recordings = recorded_requests()
    user = User.objects.create_user("bench", "bench@example.org", "bench-password")
    token = ApiToken.issue(user=user, name="bench")[1]
    timings: list[float] = []
    record = observe.record

    def timed(call: Any, provider: Any) -> Any:
        start = time.perf_counter()
        try:
            return record(call, provider)
        finally:
            timings.append((time.perf_counter() - start) * 1000)

    observe.record = timed  # type: ignore[assignment]

    def respond(body: dict[str, Any]) -> Answer:
        found = next(r for r in recordings if r["body"]["messages"] == body["messages"])
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in found.get("response_tool_calls") or []]
        return Answer(content=found["response_text"] or None, tool_calls=calls)

    def replay(name: str, before_each: Callable[[], None]) -> list[float]:
        profile = AgentProfile.objects.create(owner=user, name=name, policy="copaw", max_input_length=12_000)
        UpstreamProvider.objects.create(profile=profile, base_url=provider.base_url, api_key="sk-bench",
                                        mode=UpstreamProvider.Mode.OBSERVE, timeout=30)
        timings.clear()
        for found in recordings:
            before_each()
            body = {**found["body"], "stream": False}
            answer = client.post("/v1/chat/completions", json.dumps(body), content_type="application/json",
                                 headers={"Authorization": f"Bearer {token}", "X-ContextLab-Profile": name})
            assert answer.status_code == 200, answer.content[:300]
        return list(timings)

    def forget() -> None:
        with observe._kept_lock:
            observe._kept.clear()

    client = Client()
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
          f"{len(recordings)} CoPaw requests per run")
    print(f"{'':<9} | {'calls 1-10':>10} {'31-40':>7} {'66-75':>7} | {'whole run':>9}   (record, ms; run in s)")
    with Provider(respond) as provider:
        results = {"rebuilt": replay("rebuilt", forget), "kept": replay("kept", lambda: None)}
    for label, times in results.items():
        print(f"{label:<9} | {statistics.median(times[:10]):>10.1f} {statistics.median(times[30:40]):>7.1f} "
              f"{statistics.median(times[65:75]):>7.1f} | {sum(times) / 1000:>9.2f}")
    late = statistics.median(results["rebuilt"][65:75]) / statistics.median(results["kept"][65:75])
    print(f"calls 66-75: rebuilt / kept = {late:.1f}x")


if __name__ == "__main__":
    main()
