"""A generated corpus that is hard on compaction counts: the claim "the contextlab policy
compacts no more often than copaw" has to hold on every row of it.

Deterministic (a seeded generator, no file committed): each transcript stresses one way a
policy can compact too often.

* **byte edges**: tool outputs just under and just over the stage-1 and stage-2 byte
  limits (``recent_max_bytes``, ``old_max_bytes``), so the two policies cut differently;
* **bursts**: runs of many small turns (a word or two, a short tool call) between long ones;
* **one crossing**: a context that sits just under the threshold and is pushed over by a
  single message, again and again;
* **dense**: records, hashes and numbers (fewer bytes a token than prose: CoPaw's byte
  estimate undercounts them and waits longer);
* **chinese**: the same for CJK text (three bytes a character, about a token each);
* **mixed**: all of it, interleaved.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contextlab.engine.core.profile import Profile

WINDOWS = (8_000, 16_000, 32_000)
_WORDS = ("build", "module", "cache", "linker", "warning", "route", "handler", "retry", "socket", "queue",
          "schema", "column", "index", "token", "budget", "session", "worker", "deploy", "branch", "commit")


_CJK_WORDS = ("构建", "模块", "缓存", "链接器", "警告", "路由", "处理器", "重试", "队列", "索引", "会话", "部署", "分支", "提交")


class _Writer:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.messages: list[dict[str, Any]] = []
        self.calls = 0

    def text(self, n_bytes: int) -> str:
        lines: list[str] = []
        size = 0
        while size < n_bytes:
            line = (f"{self.rng.choice(_WORDS)}_{self.rng.randrange(1000):03d}: "
                    + " ".join(self.rng.choice(_WORDS) for _ in range(self.rng.randrange(4, 12))))
            lines.append(line)
            size += len(line) + 1
        return "\n".join(lines)[:n_bytes]

    def dense(self, n_bytes: int) -> str:
        """Text with fewer bytes per token than prose (numbers, hex, JSON punctuation): a byte
        estimate undercounts it, so an estimating policy compacts later than an exact one."""
        rows: list[str] = []
        size = 0
        while size < n_bytes:
            row = json.dumps({"id": self.rng.randrange(10**6), "sha": f"{self.rng.getrandbits(48):012x}",
                              "t": round(self.rng.random() * 1000, 3), "ok": self.rng.random() < 0.9},
                             separators=(",", ":"))
            rows.append(row)
            size += len(row) + 1
        return "\n".join(rows)[:n_bytes]

    def cjk(self, n_bytes: int) -> str:
        """Chinese log lines: three UTF-8 bytes a character, about a token each."""
        lines: list[str] = []
        size = 0
        while size < n_bytes:
            line = "，".join(self.rng.choice(_CJK_WORDS) for _ in range(self.rng.randrange(4, 10))) + "。"
            lines.append(line)
            size += len(line.encode()) + 1
        return "\n".join(lines)

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def tool(self, output_bytes: int, *, say: str = "Running it.", dense: bool = False, cjk: bool = False) -> None:
        self.calls += 1
        call_id = f"call_{self.calls}"
        self.messages.append({"role": "assistant", "content": say, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "run_shell", "arguments": json.dumps({"command": f"make step{self.calls}"})}}]})
        output = self.dense(output_bytes) if dense else self.cjk(output_bytes) if cjk else self.text(output_bytes)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": output})

    def answer(self, n_bytes: int = 60) -> None:
        self.messages.append({"role": "assistant", "content": self.text(n_bytes).replace("\n", " ")})


def byte_edges(w: _Writer, profile: Profile) -> None:
    edges = [profile.old_max_bytes - 40, profile.old_max_bytes + 40,
             profile.recent_max_bytes - 40, profile.recent_max_bytes + 40]
    for turn in range(12):
        w.user(f"Step {turn}: run the next target and tell me what failed.")
        for size in edges if turn % 3 == 0 else edges[:2]:
            w.tool(size)
        w.answer()


def bursts(w: _Writer, profile: Profile) -> None:
    for burst in range(8):
        w.user(f"Burst {burst}: go through the queue one item at a time.")
        w.tool(profile.old_max_bytes * 2)
        for item in range(25):
            w.user(f"ok, item {item}")
            w.tool(120, say="Next.")
            w.answer(30)


def one_crossing(w: _Writer, profile: Profile) -> None:
    # Grow with small turns until just under the threshold, then one large message crosses it.
    for round_no in range(10):
        for step in range(8):
            w.user(f"Round {round_no}, step {step}: continue.")
            w.tool(profile.old_max_bytes - 200)
            w.answer()
        w.user(f"Round {round_no}: here is the whole log to read.\n" + w.text(profile.max_input_length))
        w.answer()


def dense_outputs(w: _Writer, profile: Profile) -> None:
    # Records, hashes and numbers: many tokens per byte, at sizes around both byte limits.
    sizes = [profile.old_max_bytes - 40, profile.old_max_bytes + 40, profile.old_max_bytes * 3]
    for turn in range(30):
        w.user(f"Query {turn}: fetch the next page of records.")
        w.tool(sizes[turn % 3], dense=True)
        if turn % 4 == 3:
            w.tool(profile.recent_max_bytes + 40 if turn % 8 == 7 else profile.recent_max_bytes - 40, dense=True)
        w.answer()


def chinese(w: _Writer, profile: Profile) -> None:
    # Chinese tool output around the stage-2 limit, and one long Chinese message per round.
    for round_no in range(6):
        for step in range(6):
            w.user(f"第 {round_no} 轮，第 {step} 步：继续。")
            w.tool(profile.old_max_bytes + (40 if step % 2 else -40), cjk=True)
            w.answer()
        w.user("请阅读完整的日志：\n" + w.cjk(profile.max_input_length))


def mixed(w: _Writer, profile: Profile) -> None:
    for part in range(3):
        byte_edges(w, profile) if part != 1 else bursts(w, profile)
        one_crossing(w, profile)
        dense_outputs(w, profile) if part != 2 else chinese(w, profile)


SCENARIOS: dict[str, Callable[[_Writer, Profile], None]] = {
    "byte-edges": byte_edges, "bursts": bursts, "one-crossing": one_crossing, "dense": dense_outputs,
    "chinese": chinese, "mixed": mixed,
}


def write_transcript(name: str, window: int, folder: Path) -> Path:
    """The scenario ``name`` generated for a ``window``-token profile, written as an OpenAI message list."""
    profile = Profile(max_input_length=window)
    writer = _Writer(seed=hash_seed(name, window))
    writer.messages.append({"role": "system", "content": "You are a careful build agent."})
    SCENARIOS[name](writer, profile)
    path = folder / f"{name}-{window}.json"
    path.write_text(json.dumps(writer.messages), encoding="utf-8")
    return path


def hash_seed(name: str, window: int) -> int:
    # Python's hash() of a str changes per process; this does not.
    return sum(ord(c) * 31 ** i for i, c in enumerate(name)) % 1_000_003 + window
