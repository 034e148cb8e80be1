"""Drive a running ContextLab server through a long agent session.

A simulated agent works on a task for N turns. Before every "LLM call" it asks
the server to run the pre-reasoning hook and takes the messages it gets back;
its "LLM" then calls a tool whose output is large (build logs, files, web
pages), and the next turn starts. The profile uses the offline extractive
compactor, so no model or key is needed. Per turn it prints the payload size
and whether the server compacted::

    python manage.py createapitoken alice          # last line is the token
    python examples/agent_loop.py --token cl_... --turns 200

Then open the session page the last line prints.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

# Run from a checkout without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contextlab.client import ContextLabClient  # noqa: E402

SYSTEM_PROMPT = (
    "You are a build engineer agent working in /srv/shop. Use run_shell, read_file, grep and "
    "browser_snapshot. Keep exact error messages and file paths in your notes."
)
TASKS = [
    "The release build of /srv/shop fails on the payments module. Find the cause and fix it.",
    "Now make the checkout tests pass again; do not change the public API of shop/cart.py.",
    "Check the vendor docs for the new tax API and update shop/tax.py accordingly.",
    "Prepare release notes in docs/RELEASE.md listing every fix you made.",
]
MODULES = ["payments", "cart", "tax", "checkout", "inventory", "search", "auth", "emails"]


class SimulatedAgent:
    """Chooses a tool call per turn and produces its (large) output, reproducibly."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def next_call(self, turn: int) -> tuple[dict[str, Any], dict[str, Any]]:
        module = self.rng.choice(MODULES)
        tool = self.rng.choices(["run_shell", "read_file", "grep", "browser_snapshot"], weights=[4, 3, 2, 1])[0]
        if tool == "run_shell":
            args: dict[str, Any] = {"command": f"make test-{module} V=1"}
            output = self._build_log(module, lines=self.rng.randint(60, 400))
        elif tool == "read_file":
            suffix = ".md" if self.rng.random() < 0.2 else ".py"
            args = {"file_path": f"/srv/shop/shop/{module}{suffix}", "start_line": 1}
            output = self._source(module, lines=self.rng.randint(40, 250))
        elif tool == "grep":
            args = {"pattern": f"{module}_total", "path": "/srv/shop"}
            output = "\n".join(f"/srv/shop/shop/{m}.py:{self.rng.randint(1, 900)}:    {module}_total = compute_{m}(order)"
                               for m in self.rng.choices(MODULES, k=self.rng.randint(10, 80)))
        else:
            args = {"url": f"https://docs.vendor.example/{module}/api"}
            output = self._page(module, paragraphs=self.rng.randint(10, 60))
        call_id = f"call_{turn}_{self.rng.randrange(16**8):08x}"
        assistant = {
            "role": "assistant",
            "content": f"Turn {turn}: checking {module} with {tool}.",
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": tool, "arguments": json.dumps(args)}}],
        }
        return assistant, {"role": "tool", "tool_call_id": call_id, "content": output}

    def _build_log(self, module: str, lines: int) -> str:
        out = [f"cc -O2 -c shop/{module}/part_{i:03d}.c -o build/{module}/part_{i:03d}.o" for i in range(lines)]
        if self.rng.random() < 0.5:
            out.append(f"shop/{module}/part_{lines // 2:03d}.c:{self.rng.randint(10, 400)}: error: "
                       f"'{module}_total' undeclared (first use in this function)")
            out.append(f"make: *** [Makefile:88: test-{module}] Error 1")
        else:
            out.append(f"{lines} files compiled, all {module} tests passed")
        return "\n".join(out)

    def _source(self, module: str, lines: int) -> str:
        return "\n".join(f"{i:4d}  def {module}_step_{i}(order):  # keeps the {module} ledger consistent"
                         for i in range(1, lines + 1))

    def _page(self, module: str, paragraphs: int) -> str:
        return "\n\n".join(f"<p>The {module} endpoint v{i} accepts <code>amount</code> in cents and returns "
                           f"<b>HTTP 422</b> when the currency is missing.</p>" for i in range(paragraphs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("CONTEXTLAB_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("CONTEXTLAB_TOKEN"),
                        help="API token (or $CONTEXTLAB_TOKEN); from `manage.py createapitoken USER`")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--window", type=int, default=16_000, help="context window of the profile, in tokens")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("give --token or set CONTEXTLAB_TOKEN")

    client = ContextLabClient(args.url, args.token)
    agent = SimulatedAgent(args.seed)
    profile = {"name": f"agent-loop-{random.Random().randrange(16**6):06x}", "max_input_length": args.window,
               "recent_max_bytes": 8_000, "old_max_bytes": 1_500, "compactor": "extractive"}
    session = client.create_session(SYSTEM_PROMPT, profile=profile, title=f"Agent loop, {args.turns} turns")
    session_id = session["id"]
    print(f"session {session_id} (window {args.window:,}, threshold {session['tokens']['threshold']:,})")

    pending: list[dict[str, Any]] = [{"role": "user", "content": TASKS[0]}]
    compactions = 0
    for n in range(1, args.turns + 1):
        client.add_messages(session_id, pending)
        turn = client.prepare(session_id)
        compactions += turn.compacted
        # A real agent sends turn.messages to its model here and reports what it was billed.
        client.report_usage(session_id, turn.turn, {"prompt_tokens": turn.payload_tokens, "completion_tokens": 60})
        marker = "  <- compacted" if turn.compacted else ""
        print(f"turn {turn.turn:4d}  payload {turn.payload_tokens:7,} tokens  {len(turn.messages):3d} messages  "
              f"{turn.outcome}{marker}")
        assistant, result = agent.next_call(n)
        pending = [assistant, result]
        if n % 50 == 0:
            pending.append({"role": "user", "content": TASKS[(n // 50) % len(TASKS)]})

    final = client.session(session_id)
    print(f"done: {final['turns']} turns, {compactions} compaction(s), summary v{final['summary_version']}, "
          f"{final['live_messages']} of {final['messages']} messages live")
    print(f"open {args.url.rstrip('/')}{final['url']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
