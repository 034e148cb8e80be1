"""An ordinary tool-using agent that knows nothing about ContextLab.

It is written the way agents are usually written against the official
``openai`` client: keep the whole conversation in a list, send all of it on
every call, run the tools the model asks for, repeat until it answers. To put
it behind ContextLab, change nothing but where the client points and which key
it sends::

    python manage.py createapitoken alice                 # last line is the token
    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=cl_... \\
        python examples/unmodified_agent.py --task "Why does the release build fail?"

The ContextLab profile with an upstream provider (admin › Gateway › Upstream
providers) decides where the calls really go. Every call then shows up as a
turn of a session on the dashboard, and once the conversation outgrows the
profile's threshold the provider receives the compacted context while this
script still holds, and sends, its full history.

The tools work on a small pretend project in memory, so the example is safe to
run anywhere and gives the same output every time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from openai import OpenAI
from openai.types.chat import ChatCompletionChunk

SYSTEM_PROMPT = ("You are a build engineer. Use the tools to inspect the project, find why the build "
                 "fails, and answer with the cause and the fix.")
DEFAULT_TASK = "The release build of the shop project fails. Find out why."

PROJECT = {
    "Makefile": "release:\n\tcc -O2 -o shop src/main.c src/cart.c src/tax.c\n",
    "src/main.c": "#include \"cart.h\"\nint main(void) { return cart_total() > 0 ? 0 : 1; }\n",
    "src/cart.c": "#include \"cart.h\"\n#include \"tax.h\"\nint cart_total(void) { return 100 + tax_rate(); }\n",
    "src/tax.c": "/* tax_rate() was renamed to vat_rate() in 2.0 */\nint vat_rate(void) { return 19; }\n",
}

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "list_files", "description": "List the project's files.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read one file of the project.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "run_shell", "description": "Run a shell command in the project.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}},
]


def run_tool(name: str, arguments: dict[str, Any]) -> str:
    if name == "list_files":
        return "\n".join(sorted(PROJECT))
    if name == "read_file":
        path = str(arguments.get("path", ""))
        return PROJECT.get(path, f"error: no such file: {path}")
    if name == "run_shell":
        command = str(arguments.get("command", ""))
        if command.startswith("make"):
            return ("cc -O2 -o shop src/main.c src/cart.c src/tax.c\n"
                    "/usr/bin/ld: src/cart.o: in function `cart_total':\n"
                    "cart.c:(.text+0x9): undefined reference to `tax_rate'\n"
                    "collect2: error: ld returned 1 exit status\nmake: *** [Makefile:2: release] Error 1")
        return f"$ {command}\n(ok)"
    return f"error: unknown tool {name}"


def _streamed_message(client: OpenAI, model: str, messages: list[Any]) -> dict[str, Any]:
    """Call with stream=True and put the streamed deltas back together, as streaming agents do."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    stream = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,  # type: ignore[arg-type]
                                            temperature=0, stream=True)
    for chunk in stream:
        if not isinstance(chunk, ChatCompletionChunk) or not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            content.append(delta.content)
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": "", "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
            if call.id:
                entry["id"] = call.id
            if call.function and call.function.name:
                entry["function"]["name"] += call.function.name
            if call.function and call.function.arguments:
                entry["function"]["arguments"] += call.function.arguments
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def run(client: OpenAI, *, model: str, task: str, max_steps: int = 12, stream: bool = False) -> str:
    """The agent loop: the client keeps, and resends, the whole conversation."""
    messages: list[Any] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task}]
    for _ in range(max_steps):
        if stream:
            streamed = _streamed_message(client, model, messages)
            calls = [(c["id"], c["function"]["name"], c["function"]["arguments"])
                     for c in streamed.get("tool_calls", [])]
            text = streamed["content"]
            messages.append(streamed)
        else:
            reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,  # type: ignore[arg-type]
                                                   temperature=0).choices[0].message
            calls = [(c.id, c.function.name, c.function.arguments)
                     for c in reply.tool_calls or [] if c.type == "function"]
            text = reply.content
            # The usual idiom: the SDK's message object goes straight back into the history.
            messages.append(reply)
        if not calls:
            return text or ""
        for call_id, name, arguments in calls:
            try:
                parsed = json.loads(arguments or "{}")
            except ValueError:
                parsed = {}
            messages.append({"role": "tool", "tool_call_id": call_id, "content": run_tool(name, parsed)})
    return f"(no answer after {max_steps} steps)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"),
                        help="OpenAI-compatible base URL (default: $OPENAI_BASE_URL)")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                        help="the key to send (default: $OPENAI_API_KEY)")
    parser.add_argument("--model", default="gpt-4o")
    parser.add_argument("--task", default=DEFAULT_TASK)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--stream", action="store_true", help="stream every answer")
    args = parser.parse_args(argv)
    if not args.api_key:
        parser.error("give --api-key or set OPENAI_API_KEY")
    # The only lines that know where the calls go.
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    print(run(client, model=args.model, task=args.task, max_steps=args.max_steps, stream=args.stream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
