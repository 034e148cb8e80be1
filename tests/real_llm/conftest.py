"""Fixtures of the real_llm tests: llama.cpp's ``llama-server`` with a small model, for the session.

These tests run when ``CONTEXTLAB_REAL_LLM_TESTS=1`` (scripts/test.sh sets it
for its embedded-mode run). The first run on a machine compiles llama-server
(about 5 minutes, see scripts/install_real_llm.py); later runs, in any
checkout, install the cached build in seconds.

The model (SmolLM2-135M-Instruct) cannot summarise. The tests use it for what
it is: a real server with real latency, limits and imperfect replies. They
assert what crossed the wire and what the engine did with the reply, never the
reply's quality.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import gateway_server, gateway_url, provider  # noqa: F401  (fixtures)
from tests.real_llm.server import LlamaServer, RecordingProxy

REAL_LLM = os.environ.get("CONTEXTLAB_REAL_LLM_TESTS") == "1"
REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.real_llm)
            if not REAL_LLM:
                item.add_marker(pytest.mark.skip(
                    reason="real-LLM tests: set CONTEXTLAB_REAL_LLM_TESTS=1 (compiles llama-server once per machine)"))


def _installer() -> Any:
    spec = importlib.util.spec_from_file_location("install_real_llm", REPO / "scripts" / "install_real_llm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("install_real_llm", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    installer = _installer()
    try:
        binary, model = installer.install()
    except installer.InstallError as exc:
        pytest.fail(f"could not install the real LLM server: {exc}", pytrace=False)
    server = LlamaServer(binary, model, tmp_path_factory.mktemp("llama") / "server.log")
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _session_proxy(llama_server: LlamaServer) -> Iterator[RecordingProxy]:
    proxy = RecordingProxy(llama_server.port)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def llm(_session_proxy: RecordingProxy, llama_server: LlamaServer) -> Iterator[RecordingProxy]:
    """The recording proxy in front of the session's llama-server, with this test's exchanges only."""
    _session_proxy.clear()
    yield _session_proxy
    if llama_server.process is not None and llama_server.process.poll() is not None:
        pytest.fail(f"llama-server died during the test:\n{llama_server.log_tail()}", pytrace=False)
