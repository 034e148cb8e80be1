"""Tool-result truncation as the manager runs it, in two stages, and cutting a call's arguments.

Stage 1 (``_stage_one``) cuts an oversized result as it is written into the
context, to the profile's recent limit; stage 2 (``stage_two``, a step of the
hook) re-cuts, to the older limit, the results that slid out of the newest
``recent_n``. Either way the original goes once to ``tool_result/`` (the
offload store of ``truncation``) and the ledger keeps where, so ``original``
can read every cut message back in full. ``cut_arguments`` does the same for
the arguments of a call already made.

The methods are a part of ``ContextManager`` (``hook.py``), kept here so that
the hook reads as the order of a turn; the manager's state they use is listed
at the top of the class.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from contextlab.engine.core.messages import (
    Block,
    MediaBlock,
    Message,
    ResultPart,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextlab.engine.core.profile import TRUNCATION_SLACK_BYTES, Profile
from contextlab.engine.core.trace import StepRecord
from contextlab.engine.stages.tool_results import is_markdown_read, layout_of, read_file_origin, rebuild_parts
from contextlab.engine.stages.truncation import (
    OffloadStore,
    content_file_name,
    count_lines,
    cut_text,
    reference_only,
)


def shorten_arguments(value: Any, *, limit: int, file: str) -> Any:
    """Arguments with every long string value cut so the whole is about ``limit`` bytes."""
    strings: list[int] = []

    def sizes(item: Any) -> None:
        if isinstance(item, str):
            strings.append(len(item.encode("utf-8")))
        elif isinstance(item, dict):
            for sub in item.values():
                sizes(sub)
        elif isinstance(item, list):
            for sub in item:
                sizes(sub)

    sizes(value)
    long_count = sum(1 for size in strings if size > 200) or 1
    per_value = max(120, limit // long_count)

    def cut(item: Any) -> Any:
        if isinstance(item, str):
            data = item.encode("utf-8")
            if len(data) <= per_value + 80:
                return item
            head = data[:per_value].decode("utf-8", "ignore")
            return f"{head}… [{len(data) - len(head.encode('utf-8')):,} more bytes; the full arguments are in {file}]"
        if isinstance(item, dict):
            return {key: cut(sub) for key, sub in item.items()}
        if isinstance(item, list):
            return [cut(sub) for sub in item]
        return item

    shortened = cut(value)
    if len(json.dumps(shortened, ensure_ascii=False).encode("utf-8")) > 2 * limit + 200:
        # Many short values: keep a preview of the JSON, the rest is in the file.
        text = json.dumps(value, ensure_ascii=False)
        return {"arguments_preview": text[:limit], "full_arguments_file": file}
    return shortened if isinstance(shortened, dict) else {"arguments": shortened}


class ToolResultCuts:
    """The truncation steps of ``ContextManager``."""

    # The manager's state these steps read and write (set in ``ContextManager.__init__``).
    profile: Profile
    turn: int
    messages: list[Message]
    clock: Callable[[], dt.datetime]
    offload: OffloadStore
    ledger: dict[str, dict[str, Any]]
    fate: dict[str, list[dict[str, Any]]]
    _calls: dict[str, ToolUseBlock]
    _recent: deque[str]
    _slid_out: list[str]

    if TYPE_CHECKING:
        def _index_of(self, msg_id: str) -> int | None: ...

        def replace_message(self, index: int, new: Message) -> None: ...

    def _limits_for(self, call: ToolUseBlock | None, *, recent: bool) -> int:
        p = self.profile
        if call is not None and is_markdown_read(call, p):
            return p.markdown_recent_max_bytes if recent else p.markdown_old_max_bytes
        return p.recent_max_bytes if recent else p.old_max_bytes

    def _stage_one(self, msg: Message) -> Message:
        """Cut oversized results as they enter the context; offload the original once."""
        new_blocks: list[Block] = []
        changed = False
        for b_index, block in enumerate(msg.content):
            if not isinstance(block, ToolResultBlock):
                new_blocks.append(block)
                continue
            key = f"{msg.id}#{b_index}"
            self._recent.append(key)
            while len(self._recent) > self.profile.recent_n:
                self._slid_out.append(self._recent.popleft())
            call = self._calls.get(block.id)
            tool = call.name if call else block.name
            if tool in self.profile.exempt_tool_names:
                new_blocks.append(block)
                continue
            limit = self._limits_for(call, recent=True)
            new_block, entry = self.cut_block(msg, b_index, block, call, limit, stage=1)
            if entry is not None:
                changed = True
                self.ledger[key] = entry
                self.fate[msg.id].append({"event": "truncated", "stage": 1, "before_turn": self.turn + 1,
                                          "block": b_index, "bytes_before": entry["original_bytes"],
                                          "bytes_after": entry["kept_bytes"], "file": entry["file"]})
            new_blocks.append(new_block)
        if not changed:
            return msg
        return msg.replace_content(new_blocks, offload=self.offload_meta(msg.id, len(msg.content)))

    def offload_meta(self, msg_id: str, n_blocks: int) -> dict[str, dict[str, Any]]:
        return {str(i): self.ledger[f"{msg_id}#{i}"] for i in range(n_blocks) if f"{msg_id}#{i}" in self.ledger}

    def cut_block(
        self,
        msg: Message,
        b_index: int,
        block: ToolResultBlock,
        call: ToolUseBlock | None,
        limit: int,
        *,
        stage: int,
        reference: bool = False,
    ) -> tuple[ToolResultBlock, dict[str, Any] | None]:
        """Cut one result to ``limit`` bytes; returns the new block and its ledger entry."""
        key = f"{msg.id}#{b_index}"
        previous = self.ledger.get(key)
        original = self.offload.read(previous["file"]) if previous is not None else block.output_text()
        raw_len = len(original.encode("utf-8"))
        if not reference and raw_len <= limit + TRUNCATION_SLACK_BYTES:
            return block, None
        if previous is None:
            # Named after the call and the content, never at random: a replay run
            # twice, or two sessions fed the same conversation, write the same
            # notices (and so the same token counts). The call's id comes from
            # the client; a message id is generated when a client sends none.
            # Two results with the same call id and text share one file.
            saved = self.offload.save(original, name=content_file_name(f"{block.id or msg.id}#{b_index}\n{original}"))
            file_rel, sha = saved.relative, saved.sha256
            layout = layout_of(block)
        else:
            file_rel, sha = previous["file"], previous["sha256"]
            layout = previous.get("layout")
        real_path, start_line = read_file_origin(call, self.profile)
        # Workspace-relative, like CoPaw's dialog/ pointer: an agent reads it
        # from its own workspace, and a server path would mean nothing to a
        # remote agent (and would change token counts between installs).
        notice_path = real_path or file_rel
        single_line = False
        if reference:
            text = reference_only(file_path=notice_path, total_lines=count_lines(original),
                                  original_bytes=raw_len, start_line=start_line)
            kept = 0
        else:
            cut = cut_text(original, max_bytes=limit, file_path=notice_path, start_line=start_line,
                           total_lines=(start_line - 1 + count_lines(original)) if real_path else None)
            text, kept = cut.text, cut.kept_bytes
        single_line = count_lines(original) <= 1
        output: str | tuple[ResultPart, ...]
        if isinstance(block.output, str):
            output = text
        else:
            # Media parts stay; the text parts collapse into the one excerpt.
            media = tuple(p for p in block.output if isinstance(p, MediaBlock))
            output = (TextBlock(text), *media)
        entry = {
            "message_id": msg.id,
            "block": b_index,
            "tool": call.name if call else block.name,
            "tool_use_id": block.id,
            "stage": stage,
            "limit": limit,
            "original_bytes": raw_len,
            "kept_bytes": kept,
            "file": file_rel,
            "sha256": sha,
            "real_path": real_path,
            "reference_only": reference,
            "single_line": single_line,
            # For a list output: the order and sizes of its parts, so the
            # original can be rebuilt exactly from the one offloaded text.
            "layout": layout,
            "at_turn": self.turn if stage == 2 else self.turn + 1,
            "expires_at": (self.clock() + dt.timedelta(days=self.profile.retention_days)).isoformat(),
        }
        return ToolResultBlock(id=block.id, name=block.name, output=output, is_error=block.is_error), entry

    def stage_two(self, record: StepRecord) -> None:
        """Re-cut results that slid out of the newest ``recent_n`` (contextlab)."""
        cut_entries: list[dict[str, Any]] = []
        for key in self._slid_out:
            msg_id, _, b = key.rpartition("#")
            index = self._index_of(msg_id)
            if index is None:
                continue  # already compacted away
            msg = self.messages[index]
            block = msg.content[int(b)]
            if not isinstance(block, ToolResultBlock):
                continue
            call = self._calls.get(block.id)
            tool = call.name if call else block.name
            if tool in self.profile.exempt_tool_names:
                continue
            browser = tool in self.profile.browser_tool_names
            limit = self._limits_for(call, recent=False)
            original_bytes = self.ledger[key]["original_bytes"] if key in self.ledger else len(
                block.output_text().encode("utf-8"))
            if original_bytes <= limit + TRUNCATION_SLACK_BYTES:
                continue
            new_block, entry = self.cut_block(msg, int(b), block, call, limit, stage=2, reference=browser)
            if entry is None:
                continue
            before = self.ledger.get(key, {}).get("kept_bytes", original_bytes)
            self.ledger[key] = entry
            blocks = list(msg.content)
            blocks[int(b)] = new_block
            new_msg = msg.replace_content(blocks, offload=self.offload_meta(msg.id, len(blocks)))
            self.replace_message(index, new_msg)
            self.fate[msg.id].append({"event": "truncated", "stage": 2, "turn": self.turn, "block": int(b),
                                      "bytes_before": before, "bytes_after": entry["kept_bytes"],
                                      "file": entry["file"]})
            cut_entries.append({"message_id": msg.id, "tool": tool, "bytes_before": before,
                                "bytes_after": entry["kept_bytes"], "file": entry["file"],
                                "reference_only": browser})
        self._slid_out = []
        record.details["stage2"] = cut_entries
        record.numbers["stage2_count"] = len(cut_entries)
        record.numbers["stage1_total"] = sum(1 for e in self.ledger.values() if e["stage"] == 1)
        record.status = "fired" if cut_entries else "ok"
        record.outcome = (f"re-cut {len(cut_entries)} result(s) that slid out of the newest {self.profile.recent_n}"
                          if cut_entries else "no result slid out of the recent window")

    def cut_arguments(self, msg: Message, b_index: int, block: ToolUseBlock,
                      limit: int) -> tuple[ToolUseBlock, dict[str, Any] | None]:
        """Shorten the arguments of a call already made to about ``limit`` bytes.

        The original arguments (and their raw JSON) go to ``tool_result/`` first;
        every string value that is cut ends with a notice naming that file.
        """
        raw = block.raw_input if block.raw_input is not None else json.dumps(block.input, ensure_ascii=False)
        size = len(raw.encode("utf-8"))
        if size <= limit + TRUNCATION_SLACK_BYTES or (msg.metadata.get("offload_args") or {}).get(str(b_index)):
            return block, None
        original = json.dumps({"input": block.input, "raw_input": block.raw_input}, ensure_ascii=False)
        # Named after the call and its content, like cut results: replays stay deterministic.
        saved = self.offload.save(original, name=content_file_name(f"{block.id or msg.id}#{b_index}#args\n{original}"))
        shortened = shorten_arguments(block.input, limit=limit, file=saved.relative)
        new_block = ToolUseBlock(id=block.id, name=block.name, input=shortened)
        kept = len(json.dumps(shortened, ensure_ascii=False).encode("utf-8"))
        entry = {"file": saved.relative, "sha256": saved.sha256, "original_bytes": size, "kept_bytes": kept,
                 "at_turn": self.turn}
        return new_block, entry

    def original(self, msg: Message) -> Message:
        """The message as it was ingested: offloaded tool output and arguments read back in full."""
        offload = msg.metadata.get("offload")
        offload_args = msg.metadata.get("offload_args")
        if not offload and not offload_args:
            return msg
        blocks = list(msg.content)
        for b_index, entry in (offload_args or {}).items():
            use = blocks[int(b_index)]
            if isinstance(use, ToolUseBlock):
                stored = json.loads(self.offload.read(entry["file"]))
                blocks[int(b_index)] = ToolUseBlock(use.id, use.name, stored["input"], stored["raw_input"])
        offload = offload or {}
        for b_index, entry in offload.items():
            block = blocks[int(b_index)]
            if isinstance(block, ToolResultBlock):
                full = self.offload.read(entry["file"])
                output: str | tuple[ResultPart, ...] = full
                if not isinstance(block.output, str):
                    media = [p for p in block.output if isinstance(p, MediaBlock)]
                    output = rebuild_parts(full, entry.get("layout"), media)
                blocks[int(b_index)] = ToolResultBlock(block.id, block.name, output, block.is_error)
        meta = {k: v for k, v in msg.metadata.items() if k not in ("offload", "offload_args")}
        meta["offloaded_files"] = [e["file"] for e in [*offload.values(), *(offload_args or {}).values()]]
        return Message(role=msg.role, content=tuple(blocks), id=msg.id, name=msg.name,
                       timestamp=msg.timestamp, metadata=meta)
