"""Token counting: exact (tiktoken, offline) and CoPaw's byte estimate.

Vocabularies
------------
tiktoken normally downloads its vocabularies. ContextLab never lets it: the
files are installed once by ``python scripts/install_tiktoken_data.py`` (into
``var/tiktoken`` or ``$CONTEXTLAB_TIKTOKEN_DIR``), stored under tiktoken's own
cache-key names, and :func:`get_encoding` checks their size and sha256 *before*
handing the directory to tiktoken through ``TIKTOKEN_CACHE_DIR``. tiktoken
deletes a cache file whose hash is wrong and then goes to the network, which
fails here with a confusing connection error; checking first turns every such
case into :class:`~contextlab.engine.core.errors.TokenizerUnavailable` with the fix
in the message. A ``TIKTOKEN_CACHE_DIR`` the user set is respected (and checked).

What the exact counter bills (OpenAI chat completions)
------------------------------------------------------
Each internal message is counted the way OpenAI receives it after
``convert.openai.message_to_openai``; ``enc(s)`` is the number of tokens of
``s`` (``encode_ordinary``, so text such as ``"<|endoftext|>"`` is ordinary
text, as the API treats it)::

    message envelope  = 3 + enc(role) [+ 1 + enc(name) when a name is set]
    message content   = enc(text blocks joined with "\\n")
    each tool call    = 3 + enc(function name) + enc(arguments JSON)
    each tool result  = its own "tool" message: 3 + enc("tool") + 1 + enc(output text)
                        [+ 1 + enc(name) when the internal message has a name]
    each request      = + 3 (the reply is primed with the assistant header)

* The envelope, name and priming values are OpenAI's published accounting for
  chat models (gpt-3.5-turbo onwards, including the gpt-4o/4.1/5 family).
* The arguments string is the block's ``raw_input`` when the model's own JSON
  was kept, else ``json.dumps(input, ensure_ascii=False)``.
* OpenAI does not publish how tool calls are rendered. The two fixed terms
  (3 per call, 1 per result for the ``tool_call_id`` link) reproduce a public
  measurement exactly (gpt-3.5-turbo, one call and its result: 40 prompt
  tokens; see the tests). Several calls in one assistant message are rendered
  through an undocumented wrapper and may cost a few tokens more per call.
* A message holding only tool results (Anthropic and AgentScope style) becomes
  only ``tool`` messages; text next to results gets its own envelope (without
  the name), and a ``tool`` message without a result is sent as user text.
* Thinking blocks are not sent back to OpenAI chat models and cost 0. Build the
  counter with ``include_thinking=True`` to count them as text (for providers
  that take reasoning back); that counter memoises under its own key.
* Images cost :data:`IMAGE_TOKENS` (GPT-4o's tile formula for a 1024x1024 image
  at high detail: 85 + 4 x 170); the engine keeps no pixel sizes, so this is an
  estimate. Other media count the tokens of their reference (URL or path), or
  ``len(data) // 4`` for inline data. ``exact`` speaks for text only.

:meth:`TokenCounter.count_message` returns the envelope plus content of one
message, so ``count_payload(msgs) == sum(count_message(m) for m in msgs) + 3``.

Caching
-------
Counts are memoised on the message itself (``Message._token_memo[counter.key]``).
Messages are immutable and ``replace_content`` starts a fresh memo, so a memo
can never be stale; a warm count is one dict lookup per message, which is what
keeps a turn's cost independent of the session length. Messages not yet counted
are encoded together in one tight loop (``count_messages_cold`` recounts all).

The CoPaw estimator
-------------------
``int(utf8_bytes / divisor + 0.5)`` per piece, summed per block as CoPaw 1.0.2 /
ReMe 0.3.1.8 do, with no per-message overhead: text and thinking by their text;
tool_use by ``name + json.dumps(input, ensure_ascii=False)``; tool_result by its
output string or, for a list, per part (text by text, media by the media rule);
media: inline data ``len(data) // 4`` (10 when empty), a file its path, a URL
its text (10 when empty).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import tiktoken

from contextlab.engine.core.errors import TokenizerUnavailable
from contextlab.engine.core.messages import (
    MediaBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

__all__ = [
    "CL100K_BASE_FILE",
    "CL100K_BASE_SHA256",
    "CL100K_BASE_SIZE",
    "DEFAULT_ENCODING",
    "IMAGE_TOKENS",
    "INSTALL_HINT",
    "MESSAGE_TOKENS",
    "NAME_TOKENS",
    "O200K_BASE_FILE",
    "O200K_BASE_SHA256",
    "O200K_BASE_SIZE",
    "REPLY_PRIMING_TOKENS",
    "SUPPORTED_ENCODINGS",
    "TOOL_CALL_TOKENS",
    "TOOL_RESULT_TOKENS",
    "VOCABULARIES",
    "CopawEstimator",
    "EncodingLike",
    "TiktokenCounter",
    "TokenCounter",
    "Vocabulary",
    "active_vocab_dir",
    "clear_encoding_cache",
    "compare_counts",
    "default_vocab_dir",
    "get_encoding",
    "resolve_encoding_name",
    "verify_vocabularies",
]

# -- vocabulary files ------------------------------------------------------------------
# The sha256 values are the ones tiktoken itself expects (tiktoken_ext/openai_public.py);
# the file names are tiktoken's cache keys, the sha1 of each blob URL. The install
# script repeats these values because it must run before this package is importable.
O200K_BASE_FILE = "fb374d419588a4632f3f557e76b4b70aebbca790"
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
O200K_BASE_SIZE = 3_613_922
CL100K_BASE_FILE = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"
CL100K_BASE_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
CL100K_BASE_SIZE = 1_681_126

DEFAULT_ENCODING = "o200k_base"
INSTALL_HINT = (
    "run `python scripts/install_tiktoken_data.py` "
    "(or set CONTEXTLAB_TIKTOKEN_DIR to a directory holding the verified files)"
)


@dataclass(frozen=True, slots=True)
class Vocabulary:
    encoding: str
    filename: str
    size: int
    sha256: str


VOCABULARIES: dict[str, Vocabulary] = {
    "o200k_base": Vocabulary("o200k_base", O200K_BASE_FILE, O200K_BASE_SIZE, O200K_BASE_SHA256),
    "cl100k_base": Vocabulary("cl100k_base", CL100K_BASE_FILE, CL100K_BASE_SIZE, CL100K_BASE_SHA256),
}

# Encodings we can load offline, and the vocabulary file each one reads.
# o200k_harmony (gpt-oss) is o200k_base plus special tokens, same file.
SUPPORTED_ENCODINGS: dict[str, str] = {
    "o200k_base": "o200k_base",
    "o200k_harmony": "o200k_base",
    "cl100k_base": "cl100k_base",
}

# -- chat accounting (see the module docstring) --------------------------------------------
MESSAGE_TOKENS = 3
NAME_TOKENS = 1
REPLY_PRIMING_TOKENS = 3
TOOL_CALL_TOKENS = 3
TOOL_RESULT_TOKENS = 1
IMAGE_TOKENS = 765


def default_vocab_dir() -> Path:
    """``$CONTEXTLAB_TIKTOKEN_DIR``, else ``$CONTEXTLAB_VAR_DIR/tiktoken``, else ``var/tiktoken`` at the
    repository root: the same order as the settings and the install script."""
    env = os.environ.get("CONTEXTLAB_TIKTOKEN_DIR")
    if env:
        return Path(env).expanduser()
    var_dir = os.environ.get("CONTEXTLAB_VAR_DIR")
    if var_dir:
        return Path(var_dir).expanduser() / "tiktoken"
    # tokens.py -> core -> engine -> contextlab -> repository root. An installed
    # package has no repository around it, so deployments set the environment variable.
    return Path(__file__).resolve().parents[3] / "var" / "tiktoken"


# The TIKTOKEN_CACHE_DIR value this module wrote, so that a later change of
# CONTEXTLAB_TIKTOKEN_DIR is followed while a value the user set is left alone.
_env_we_set: str | None = None


def active_vocab_dir() -> Path:
    """The directory tiktoken will read: the user's ``TIKTOKEN_CACHE_DIR``, else ours."""
    current = os.environ.get("TIKTOKEN_CACHE_DIR")
    # An empty value tells tiktoken to skip its cache and download, which can
    # only fail here, so it counts as unset.
    if current and current != _env_we_set:
        return Path(current).expanduser()
    return default_vocab_dir()


def _file_problems(directory: Path, vocab: Vocabulary) -> list[str]:
    path = directory / vocab.filename
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return [f"{vocab.encoding}: missing file {path}"]
    except OSError as exc:
        return [f"{vocab.encoding}: cannot read {path}: {exc.strerror or exc}"]
    if size != vocab.size:
        return [f"{vocab.encoding}: {path} has {size:,} bytes, expected {vocab.size:,}"]
    try:
        digest = sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        return [f"{vocab.encoding}: cannot read {path}: {exc.strerror or exc}"]
    if digest != vocab.sha256:
        return [f"{vocab.encoding}: {path} has sha256 {digest}, expected {vocab.sha256}"]
    return []


def verify_vocabularies(directory: str | os.PathLike[str] | None = None) -> list[str]:
    """Human-readable problems with the vocabulary files; empty when all is well.

    ``directory`` defaults to :func:`active_vocab_dir`, the one tiktoken will read.
    """
    where = Path(directory) if directory is not None else active_vocab_dir()
    problems: list[str] = []
    for vocab in VOCABULARIES.values():
        problems.extend(_file_problems(where, vocab))
    return problems


# -- encodings ---------------------------------------------------------------------------


def resolve_encoding_name(name_or_model: str) -> str:
    """The encoding for an encoding name or a model name; unknown models get o200k_base.

    Raises TokenizerUnavailable for a model (or encoding) whose vocabulary
    ContextLab does not install, such as the p50k/r50k models, instead of
    silently counting with the wrong tokenizer.
    """
    if name_or_model in SUPPORTED_ENCODINGS:
        return name_or_model
    if name_or_model in tiktoken.list_encoding_names():
        name = name_or_model
    else:
        # "openai/gpt-4o" style names (LiteLLM, OpenRouter) carry a provider prefix.
        model = name_or_model.rsplit("/", 1)[-1]
        try:
            name = tiktoken.encoding_name_for_model(model)
        except KeyError:
            return DEFAULT_ENCODING
    if name not in SUPPORTED_ENCODINGS:
        what = (
            f"the {name} encoding"
            if name == name_or_model
            else f"{name_or_model!r} uses the {name} encoding, which"
        )
        raise TokenizerUnavailable(
            f"{what} is not installed by ContextLab; use {' or '.join(VOCABULARIES)} "
            "or a model that uses one of them",
            field="encoding",
        )
    return name


_encodings: dict[str, tiktoken.Encoding] = {}
_encodings_lock = threading.Lock()


def clear_encoding_cache() -> None:
    """Forget loaded encodings so the next :func:`get_encoding` checks the files again."""
    with _encodings_lock:
        _encodings.clear()


def get_encoding(name_or_model: str) -> tiktoken.Encoding:
    """The tiktoken encoding for an encoding or model name, loaded offline and cached.

    Raises TokenizerUnavailable (never a network error) when the vocabulary file
    is missing or corrupt.
    """
    enc = _encodings.get(name_or_model)
    if enc is not None:
        return enc
    name = resolve_encoding_name(name_or_model)
    with _encodings_lock:
        enc = _encodings.get(name)
        if enc is None:
            enc = _load_encoding(name)
            _encodings[name] = enc
        _encodings[name_or_model] = enc
    return enc


def _load_encoding(name: str) -> tiktoken.Encoding:
    global _env_we_set
    directory = active_vocab_dir()
    current = os.environ.get("TIKTOKEN_CACHE_DIR")
    if not current or current == _env_we_set:
        # tiktoken reads the variable at call time, so setting it here is enough.
        _env_we_set = str(directory)
        os.environ["TIKTOKEN_CACHE_DIR"] = _env_we_set
    problems = _file_problems(directory, VOCABULARIES[SUPPORTED_ENCODINGS[name]])
    if problems:
        raise TokenizerUnavailable(
            f"tiktoken vocabulary not usable ({'; '.join(problems)}); {INSTALL_HINT}",
            field="encoding",
        )
    try:
        return tiktoken.get_encoding(name)
    except Exception as exc:
        # The file was verified a moment ago, so this is a race with something
        # deleting it or an I/O error. Whatever tiktoken tried next (a download)
        # is not the user's problem; the missing file is.
        raise TokenizerUnavailable(
            f"tiktoken could not load {name} from {directory}: {exc}; {INSTALL_HINT}",
            field="encoding",
        ) from exc


# -- counters ------------------------------------------------------------------------------


class EncodingLike(Protocol):
    """What the exact counter needs from an encoding (tiktoken.Encoding fits)."""

    @property
    def name(self) -> str: ...

    def encode_ordinary(self, text: str) -> list[int]: ...


@runtime_checkable
class TokenCounter(Protocol):
    """Counts text and messages; counts of messages are memoised on the message."""

    @property
    def name(self) -> str:
        """A label for people, e.g. ``"tiktoken o200k_base"``."""
        ...

    @property
    def key(self) -> str:
        """The memo key, e.g. ``"tiktoken:o200k_base"`` or ``"copaw:4.0"``."""
        ...

    @property
    def exact(self) -> bool: ...

    def count_text(self, text: str) -> int: ...

    def count_message(self, msg: Message) -> int: ...

    def count_messages(self, msgs: Iterable[Message]) -> int: ...

    def count_messages_cold(self, msgs: Iterable[Message]) -> int: ...

    def count_payload(self, msgs: Iterable[Message]) -> int: ...


def _arguments_json(block: ToolUseBlock) -> str:
    if block.raw_input is not None:
        return block.raw_input
    return json.dumps(block.input, ensure_ascii=False)


class TiktokenCounter:
    """Exact counts with tiktoken, with OpenAI chat overhead (see the module docstring)."""

    exact = True

    def __init__(
        self, encoding: str | EncodingLike = DEFAULT_ENCODING, *, include_thinking: bool = False
    ) -> None:
        self._encoding: EncodingLike = get_encoding(encoding) if isinstance(encoding, str) else encoding
        # Bound once: the hot loops call it for every text.
        self._encode = self._encoding.encode_ordinary
        self.include_thinking = include_thinking
        self._key = f"tiktoken:{self._encoding.name}" + ("+thinking" if include_thinking else "")
        self._role_tokens = {r: len(self._encode(r)) for r in ("system", "user", "assistant", "tool")}

    @property
    def encoding(self) -> EncodingLike:
        return self._encoding

    @property
    def name(self) -> str:
        return f"tiktoken {self._encoding.name}" + (" (with thinking)" if self.include_thinking else "")

    @property
    def key(self) -> str:
        return self._key

    def __repr__(self) -> str:
        return f"TiktokenCounter({self._encoding.name!r}, include_thinking={self.include_thinking})"

    def count_text(self, text: str) -> int:
        return len(self._encode(text)) if text else 0

    def _plan(self, msg: Message) -> tuple[int, list[str]]:
        """Fixed tokens of ``msg`` plus the texts whose tokens must be added to them."""
        fixed = 0
        texts: list[str] = []
        parts: list[str] = []
        # Tool results become separate "tool" messages; the message's own
        # envelope is billed when anything else is left (or nothing at all was).
        own = False
        has_results = False
        tool_env = MESSAGE_TOKENS + self._role_tokens["tool"] + TOOL_RESULT_TOKENS
        for block in msg.content:
            if isinstance(block, TextBlock):
                parts.append(block.text)
            elif isinstance(block, ToolResultBlock):
                has_results = True
                fixed += tool_env
                if msg.name is not None:
                    # The converter puts the message's name on every tool message.
                    fixed += NAME_TOKENS
                    texts.append(msg.name)
                output = block.output
                if isinstance(output, str):
                    texts.append(output)
                else:
                    texts.append(block.output_text())
                    for part in output:
                        if isinstance(part, MediaBlock):
                            fixed += self._media(part, texts)
            elif isinstance(block, ToolUseBlock):
                own = True
                fixed += TOOL_CALL_TOKENS
                texts.append(block.name)
                texts.append(_arguments_json(block))
            elif isinstance(block, ThinkingBlock):
                if self.include_thinking:
                    parts.append(block.thinking)
            elif isinstance(block, MediaBlock):
                own = True
                fixed += self._media(block, texts)
        if own or parts or not has_results:
            # A "tool" message without a result can only be sent as user text.
            role = "user" if msg.role == "tool" else msg.role
            fixed += MESSAGE_TOKENS + self._role_tokens.get(role, 1)
            # Text that travels with tool results is sent after them without the name.
            if msg.name is not None and not has_results:
                fixed += NAME_TOKENS
                texts.append(msg.name)
            if parts:
                texts.append(parts[0] if len(parts) == 1 else "\n".join(parts))
        return fixed, texts

    @staticmethod
    def _media(block: MediaBlock, texts: list[str]) -> int:
        if block.kind == "image":
            return IMAGE_TOKENS
        if block.url:
            texts.append(block.url)
            return 0
        return len(block.data) // 4 if block.data else 0

    def count_message(self, msg: Message) -> int:
        memo = msg._token_memo
        n = memo.get(self._key)
        if n is None:
            fixed, texts = self._plan(msg)
            encode = self._encode
            n = fixed + sum(len(encode(t)) for t in texts if t)
            memo[self._key] = n
        return n

    def count_messages(self, msgs: Iterable[Message]) -> int:
        total = 0
        misses: list[Message] = []
        key = self._key
        for msg in msgs:
            n = msg._token_memo.get(key)
            if n is None:
                misses.append(msg)
            else:
                total += n
        if misses:
            total += self._fill(misses)
        return total

    def count_messages_cold(self, msgs: Iterable[Message]) -> int:
        """Recount every message, ignoring memos, and store the fresh counts.

        Messages are planned first and their texts encoded in one tight loop,
        so a full recount runs at about the speed of tiktoken on the same text.
        """
        return self._fill(list(msgs))

    def count_payload(self, msgs: Iterable[Message]) -> int:
        return self.count_messages(msgs) + REPLY_PRIMING_TOKENS

    def _fill(self, msgs: Sequence[Message]) -> int:
        fixeds: list[int] = []
        bounds: list[int] = []
        texts: list[str] = []
        for msg in msgs:
            fixed, pieces = self._plan(msg)
            fixeds.append(fixed)
            texts.extend(pieces)
            bounds.append(len(texts))
        lengths = self._encode_lengths(texts)
        key = self._key
        total = 0
        start = 0
        for msg, fixed, end in zip(msgs, fixeds, bounds, strict=True):
            n = fixed + sum(lengths[start:end])
            msg._token_memo[key] = n
            total += n
            start = end
        return total

    def _encode_lengths(self, texts: list[str]) -> list[int]:
        # A plain loop on purpose. encode_ordinary_batch hands every text to a
        # thread pool separately: measured 5x slower than this loop on many
        # short texts and no faster on a 2,000-message session, and it keeps all
        # token lists alive at once. Hand-made chunks in threads ranged from
        # 1.5x faster to 2x slower depending on the text and machine load, which
        # a web server sharing its cores cannot rely on.
        encode = self._encode
        return [len(encode(t)) if t else 0 for t in texts]


class CopawEstimator:
    """CoPaw's estimate, ``int(utf8_bytes / divisor + 0.5)`` per piece, no overhead."""

    exact = False

    def __init__(self, divisor: float = 4.0, *, include_thinking: bool = True) -> None:
        if not divisor > 0:
            raise ValueError(f"divisor must be positive, got {divisor!r}")
        self.divisor = float(divisor)
        self.include_thinking = include_thinking
        self._key = f"copaw:{self.divisor}" + ("" if include_thinking else "-thinking")

    @property
    def name(self) -> str:
        return f"CoPaw estimate (bytes/{self.divisor})" + (
            "" if self.include_thinking else " without thinking"
        )

    @property
    def key(self) -> str:
        return self._key

    def __repr__(self) -> str:
        return f"CopawEstimator({self.divisor}, include_thinking={self.include_thinking})"

    def count_text(self, text: str) -> int:
        # ASCII is one byte per character: skip building a copy of a large text.
        # Lone surrogates (from JSON "\\ud800") would make CoPaw raise; count them
        # as the 3 bytes they would take rather than fail.
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        return int(size / self.divisor + 0.5)

    def _media(self, block: MediaBlock) -> int:
        if block.data is not None:
            return len(block.data) // 4 if block.data else 10
        if block.kind == "file":
            return self.count_text(block.url or "")
        return self.count_text(block.url) if block.url else 10

    def _count_blocks(self, msg: Message) -> int:
        n = 0
        for block in msg.content:
            if isinstance(block, TextBlock):
                n += self.count_text(block.text)
            elif isinstance(block, ToolResultBlock):
                if isinstance(block.output, str):
                    n += self.count_text(block.output)
                else:
                    for part in block.output:
                        n += self.count_text(part.text) if isinstance(part, TextBlock) else self._media(part)
            elif isinstance(block, ToolUseBlock):
                n += self.count_text(block.name + json.dumps(block.input, ensure_ascii=False))
            elif isinstance(block, ThinkingBlock):
                if self.include_thinking:
                    n += self.count_text(block.thinking)
            elif isinstance(block, MediaBlock):
                n += self._media(block)
        return n

    def count_message(self, msg: Message) -> int:
        memo = msg._token_memo
        n = memo.get(self._key)
        if n is None:
            n = memo[self._key] = self._count_blocks(msg)
        return n

    def count_messages(self, msgs: Iterable[Message]) -> int:
        count = self.count_message
        return sum(count(m) for m in msgs)

    def count_messages_cold(self, msgs: Iterable[Message]) -> int:
        total = 0
        key = self._key
        for msg in msgs:
            n = msg._token_memo[key] = self._count_blocks(msg)
            total += n
        return total

    def count_payload(self, msgs: Iterable[Message]) -> int:
        # CoPaw adds nothing per request either.
        return self.count_messages(msgs)


def compare_counts(
    msgs: Iterable[Message],
    *,
    exact: TokenCounter | None = None,
    estimate: TokenCounter | None = None,
) -> dict[str, Any]:
    """Exact count and CoPaw estimate of the same messages, for side-by-side display.

    ``exact`` is what the provider bills for these messages (envelopes
    included), ``exact_payload`` adds the reply priming of one request;
    ``estimate`` is what CoPaw would have seen (it has no overhead at all).
    ``ratio`` is exact / estimate; about 2 on JSON and logs, which is why CoPaw
    compacts too late there.
    """
    items = list(msgs)
    exact_counter = exact if exact is not None else TiktokenCounter()
    estimate_counter = estimate if estimate is not None else CopawEstimator()
    exact_n = exact_counter.count_messages(items)
    estimate_n = estimate_counter.count_messages(items)
    return {
        "exact": exact_n,
        # Every count is memoised by now, so this second pass is lookups only.
        "exact_payload": exact_counter.count_payload(items),
        "estimate": estimate_n,
        "exact_counter": exact_counter.key,
        "estimate_counter": estimate_counter.key,
        "difference": exact_n - estimate_n,
        "ratio": round(exact_n / estimate_n, 3) if estimate_n else None,
    }
