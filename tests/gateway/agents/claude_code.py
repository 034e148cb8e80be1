"""Running the real Claude Code CLI (pinned, installed by scripts/install_agent_clis.sh) headless."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
NPM_PREFIX = Path(os.environ.get("CONTEXTLAB_NPM_PREFIX") or REPO / "var" / "npm")
CLAUDE = NPM_PREFIX / "node_modules" / ".bin" / "claude"
MODEL = "claude-sonnet-4-5"


def claude_or_skip() -> Path:
    if not CLAUDE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"Claude Code is not installed at {CLAUDE}: scripts/install_agent_clis.sh installs it")
        pytest.skip("Claude Code is not installed: run scripts/install_agent_clis.sh")
    return CLAUDE


@dataclass
class Run:
    returncode: int
    result: dict[str, Any]
    stderr: str


def run_claude(prompt: str, *, cwd: Path, home: Path, base_url: str, env: dict[str, str],
               cont: bool = False, timeout: float = 120) -> Run:
    """``claude -p PROMPT`` headless, as root in CI: IS_SANDBOX=1 lets it bypass permissions there."""
    home.mkdir(parents=True, exist_ok=True)
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "IS_SANDBOX": "1",
        "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1", "ANTHROPIC_BASE_URL": base_url, **env,
    }
    command = [str(claude_or_skip()), "-p", prompt, "--output-format", "json", "--permission-mode",
               "bypassPermissions", "--model", MODEL]
    if cont:
        command.append("--continue")
    done = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    except ValueError:
        result = {"unparsed": done.stdout}
    return Run(done.returncode, result, done.stderr)
