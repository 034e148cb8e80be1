"""The ``contextlab`` command line: ``replay``, ``compare``, ``import-copaw``, ``import-requests`` and
``import-otlp``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from contextlab.engine.core.errors import ContextLabError, MalformedInput
from contextlab.engine.core.profile import Profile


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="contextlab", description="Context-management engine and debugger.")
    commands = parser.add_subparsers(dest="command", required=True)
    replay = commands.add_parser(
        "replay",
        help="replay a recorded transcript through the pre-reasoning hook",
        description="Replay a transcript turn by turn (a turn ends before each assistant message) and write "
        "the workspace, trace.jsonl and final_context.json.",
    )
    replay.add_argument("transcript", help="a transcript file (Claude Code, OpenHands, LangGraph, tau-bench, "
                        "SWE-agent, DeerFlow SSE, ReMe list, or OpenAI/Anthropic/AgentScope messages)")
    replay.add_argument("--out", required=True, help="output folder (the agent workspace)")
    replay.add_argument("--policy", choices=("contextlab", "copaw", "eviction"), help="default: contextlab")
    replay.add_argument("--strategy", choices=("lowest_score_first", "sliding_window", "hierarchical_quota"),
                        help="eviction strategy (with --policy eviction)")
    replay.add_argument("--profile", help="a profile JSON file; flags below override it")
    replay.add_argument("--max-input-length", type=int, help="context window in tokens")
    replay.add_argument("--compactor", choices=("extractive", "openai"), help="who writes the summary")
    replay.add_argument("--overwrite", action="store_true", help="replace an earlier replay in --out")
    replay.add_argument("--quiet", action="store_true", help="no progress output")
    compare = commands.add_parser(
        "compare",
        help="replay a transcript under every policy and compare them",
        description="Replay a transcript under contextlab, copaw and each eviction strategy; print tokens over "
        "turns, what each summarized, externalized or dropped, and whether every original is recoverable.",
    )
    compare.add_argument("transcript")
    compare.add_argument("--out", required=True, help="folder for one sub-folder per policy and comparison.json")
    compare.add_argument("--profile", help="a profile JSON file")
    compare.add_argument("--max-input-length", type=int, help="context window in tokens")
    copaw = commands.add_parser(
        "import-copaw",
        help="read a CoPaw workspace (folder or zip) and report what its context management did",
        description="Rebuild a CoPaw session's history from its workspace: profile knobs, live and archived "
        "messages, compactions, truncated tool results and the losses CoPaw is known for.",
    )
    copaw.add_argument("workspace", help="the agent's workspace folder, or a zip of it")
    copaw.add_argument("--requests", help="a folder (or zip) of the agent's recorded LLM requests, which places "
                       "each compaction on its request")
    copaw.add_argument("--json", action="store_true", help="print the report as JSON")
    requests = commands.add_parser(
        "import-requests",
        help="infer an agent's own context management from a folder of recorded request bodies",
        description="Compare each recorded chat-completions request with the previous one of its conversation: "
        "dropped messages, cut tool outputs, summaries and their diffs, side calls.",
    )
    requests.add_argument("folder", help="a folder (or zip) of *.json request bodies or request records")
    requests.add_argument("--json", action="store_true", help="print the report as JSON")
    otlp = commands.add_parser(
        "import-otlp",
        help="infer an agent's own context management from an OTLP JSON trace of its LLM calls",
        description="Read the LLM spans of an OpenTelemetry trace export (GenAI conventions or OpenInference) "
        "as the agent's requests, then compare each with the previous one of its conversation.",
    )
    otlp.add_argument("trace", help="an OTLP JSON file (one export, or one per line)")
    otlp.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def run_import_copaw(args: argparse.Namespace) -> int:
    from contextlab.engine.importers.copaw_workspace import import_copaw_workspace, render_report

    _, report = import_copaw_workspace(args.workspace, args.requests)
    print(json.dumps(report, ensure_ascii=False, indent=1) if args.json else render_report(report))
    return 0


def run_import_requests(args: argparse.Namespace) -> int:
    from contextlab.engine.importers.copaw_workspace import (
        REQUEST_MARKERS,
        observe_requests,
        opened_folder,
        read_request_folder,
    )
    from contextlab.engine.observe.inference import render_requests_report, requests_report

    with opened_folder(args.folder, REQUEST_MARKERS) as folder:
        inner = folder / "requests" if (folder / "requests").is_dir() else folder
        report = requests_report(observe_requests(read_request_folder(inner)))
    print(json.dumps(report, ensure_ascii=False, indent=1) if args.json else render_requests_report(report))
    return 0


def run_import_otlp(args: argparse.Namespace) -> int:
    from contextlab.engine.importers.copaw_workspace import observe_requests
    from contextlab.engine.importers.json_stream import ParseBudget
    from contextlab.engine.observe.inference import (
        load_recorded_request,
        render_requests_report,
        requests_report,
    )
    from contextlab.engine.observe.otlp import file_requests

    try:
        with open(args.trace, "rb") as fh:
            records, _ = file_requests(fh, ParseBudget.for_size(os.fstat(fh.fileno()).st_size))
    except ValueError as exc:
        raise MalformedInput(f"{args.trace} is not an OTLP JSON trace export: {exc}") from exc
    if not records:
        raise MalformedInput(f"{args.trace} holds no LLM call (no span with gen_ai.* or llm.* input messages)")
    report = requests_report(observe_requests([load_recorded_request(r, r["seq"]) for r in records]))
    print(json.dumps(report, ensure_ascii=False, indent=1) if args.json else render_requests_report(report))
    return 0


def _profile(args: argparse.Namespace) -> Profile:
    profile = Profile.from_json_file(args.profile) if args.profile else Profile()
    if args.max_input_length is not None:
        profile = profile.replace(max_input_length=args.max_input_length)
    return profile


def run_compare(args: argparse.Namespace) -> int:
    from contextlab.engine.replay.compare import compare_policies, render

    profile = _profile(args)
    results = compare_policies(args.transcript, args.out, profile=profile)
    print(render(results, window=profile.max_input_length))
    return 0


def run_replay(args: argparse.Namespace) -> int:
    from contextlab.engine.replay.transcript import replay_transcript

    profile = _profile(args)
    changes: dict[str, object] = {}
    if args.policy:
        changes["policy"] = args.policy
    if args.compactor:
        changes["compactor"] = args.compactor
    if args.strategy:
        changes["eviction_strategy"] = args.strategy
    if changes:
        profile = profile.replace(**changes)
    report = replay_transcript(args.transcript, args.out, profile=profile, overwrite=args.overwrite,
                               progress=None if args.quiet else sys.stderr)
    print(report.summary_line())
    for warning in report.warnings[:20]:
        print(f"warning: {warning}", file=sys.stderr)
    if len(report.warnings) > 20:
        print(f"warning: … and {len(report.warnings) - 20} more", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "replay":
            return run_replay(args)
        if args.command == "compare":
            return run_compare(args)
        if args.command == "import-copaw":
            return run_import_copaw(args)
        if args.command == "import-requests":
            return run_import_requests(args)
        if args.command == "import-otlp":
            return run_import_otlp(args)
    except ContextLabError as exc:
        print(f"contextlab: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"contextlab: error: {exc.strerror}: {exc.filename}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
