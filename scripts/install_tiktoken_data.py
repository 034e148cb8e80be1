#!/usr/bin/env python3
"""Install tiktoken's o200k_base and cl100k_base vocabularies for offline use.

tiktoken downloads its vocabularies from OpenAI's blob store the first time an
encoding is used. ContextLab must count tokens on machines that can reach only
the package registries, so this script takes the two files from a package that
ships them unchanged: the ``litellm`` wheel on PyPI. litellm is never installed;
the wheel is downloaded into a temporary directory, the two members are read
with ``zipfile``, and each is checked against the sha256 that tiktoken itself
expects before it is written.

The files are stored under tiktoken's cache-key names (the sha1 of the blob
URL), so pointing ``TIKTOKEN_CACHE_DIR`` at the destination is all tiktoken
needs; ``contextlab.engine.core.tokens`` does that.

Usage::

    python scripts/install_tiktoken_data.py [--dest DIR] [--wheel PATH]

The destination is ``--dest``, else ``$CONTEXTLAB_TIKTOKEN_DIR``, else
``var/tiktoken`` in the repository. Exit status 0 means both files are present
and verified; anything else comes with one clear message on stderr.

Standard library only, so it runs with any python3 before the project's
dependencies are installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

# Keep in sync with contextlab/engine/core/tokens.py (a test compares them). They are
# repeated here because this script must run before the package is importable.
LITELLM_VERSION = "1.110.2"
# The exact wheel the members below were measured in. Asking pip for it
# explicitly makes the download the same file on every host; a plain download
# is the fallback when a mirror lacks that build.
PINNED_WHEEL_TAGS = (
    "--platform",
    "manylinux_2_28_x86_64",
    "--python-version",
    "3.10",
    "--implementation",
    "cp",
    "--abi",
    "abi3",
)
MEMBER_DIR = "litellm/litellm_core_utils/tokenizers/"


@dataclass(frozen=True)
class Vocabulary:
    encoding: str
    cache_key: str  # sha1 of the blob URL: the file name tiktoken looks for
    size: int
    sha256: str  # the value tiktoken_ext/openai_public.py expects


VOCABULARIES = (
    Vocabulary(
        "o200k_base",
        "fb374d419588a4632f3f557e76b4b70aebbca790",
        3_613_922,
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    Vocabulary(
        "cl100k_base",
        "9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
        1_681_126,
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
)


class InstallError(Exception):
    """A failure the user has to act on; the message says what happened."""


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def default_dest() -> Path:
    """Where the server looks (contextlab/settings.py): $CONTEXTLAB_TIKTOKEN_DIR, else
    $CONTEXTLAB_VAR_DIR/tiktoken, else var/tiktoken in the repository."""
    env = os.environ.get("CONTEXTLAB_TIKTOKEN_DIR")
    if env:
        return Path(env).expanduser()
    var_dir = os.environ.get("CONTEXTLAB_VAR_DIR")
    if var_dir:
        return Path(var_dir).expanduser() / "tiktoken"
    return repo_root() / "var" / "tiktoken"


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_is_valid(path: Path, vocab: Vocabulary) -> bool:
    try:
        # A size check first avoids hashing a file that is obviously wrong.
        if path.stat().st_size != vocab.size:
            return False
        return sha256_of(path.read_bytes()) == vocab.sha256
    except OSError:
        return False


def download_wheel(workdir: Path) -> Path:
    """Fetch the litellm wheel with pip into ``workdir`` and return its path."""
    base = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "-d",
        str(workdir),
    ]
    attempts = [
        [*base, *PINNED_WHEEL_TAGS, f"litellm=={LITELLM_VERSION}"],
        [*base, f"litellm=={LITELLM_VERSION}"],
    ]
    errors: list[str] = []
    for cmd in attempts:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise InstallError(f"could not run pip with {sys.executable}: {exc}") from exc
        wheels = sorted(workdir.glob(f"litellm-{LITELLM_VERSION}-*.whl"))
        if proc.returncode == 0 and wheels:
            return wheels[0]
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        errors.append(" | ".join(tail) or f"pip exited with status {proc.returncode}")
    raise InstallError(
        f"pip could not download litellm=={LITELLM_VERSION} (is PyPI or a mirror reachable, "
        f"and is pip available for {sys.executable}?): " + "; ".join(errors)
    )


def read_members(wheel: Path) -> dict[str, bytes]:
    """The two vocabulary blobs from the wheel, keyed by encoding, each verified."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise InstallError(f"{wheel.name} is not a readable wheel: {exc}") from exc
    out: dict[str, bytes] = {}
    with archive:
        names = set(archive.namelist())
        for vocab in VOCABULARIES:
            member = MEMBER_DIR + vocab.cache_key
            if member not in names:
                present = sorted(n[len(MEMBER_DIR) :] for n in names if n.startswith(MEMBER_DIR))
                raise InstallError(
                    f"{wheel.name} has no member {member} ({vocab.encoding}); "
                    f"files under {MEMBER_DIR}: {', '.join(present) or 'none'}"
                )
            data = archive.read(member)
            digest = sha256_of(data)
            if len(data) != vocab.size or digest != vocab.sha256:
                raise InstallError(
                    f"{vocab.encoding} from {wheel.name} does not match the official file: "
                    f"{len(data):,} bytes, sha256 {digest} "
                    f"(expected {vocab.size:,} bytes, sha256 {vocab.sha256})"
                )
            out[vocab.encoding] = data
    return out


def write_atomically(path: Path, data: bytes) -> None:
    # Write next to the target and rename, so a reader (or an interrupted run)
    # never sees a half-written vocabulary: tiktoken would delete it and go online.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp creates 0600; the web server may run as another user, so give
        # the file the permissions a normal write would have had.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def install(dest: Path, wheel: Path | None = None) -> list[str]:
    """Make sure ``dest`` holds both verified files; return one line per file."""
    missing = [v for v in VOCABULARIES if not file_is_valid(dest / v.cache_key, v)]
    if not missing:
        return [f"{v.encoding}: already installed and verified ({dest / v.cache_key})" for v in VOCABULARIES]
    with tempfile.TemporaryDirectory(prefix="contextlab-tiktoken-") as tmp:
        if wheel is None:
            print(f"Downloading litellm=={LITELLM_VERSION} (about 44 MB, not installed) ...", flush=True)
            wheel = download_wheel(Path(tmp))
        blobs = read_members(wheel)
    # Only now touch the destination: a failed download leaves nothing behind.
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InstallError(f"cannot create {dest}: {exc}") from exc
    lines: list[str] = []
    for vocab in VOCABULARIES:
        target = dest / vocab.cache_key
        if vocab in missing:
            try:
                write_atomically(target, blobs[vocab.encoding])
            except OSError as exc:
                raise InstallError(f"cannot write {target}: {exc}") from exc
            # Read back: a full disk or a flaky mount must not pass silently.
            if not file_is_valid(target, vocab):
                raise InstallError(f"{target} does not verify after writing it")
            lines.append(
                f"{vocab.encoding}: installed {vocab.size:,} bytes, sha256 {vocab.sha256} -> {target}"
            )
        else:
            lines.append(f"{vocab.encoding}: already installed and verified ({target})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--dest",
        type=Path,
        default=None,
        help="directory for the files (default: $CONTEXTLAB_TIKTOKEN_DIR, else $CONTEXTLAB_VAR_DIR/tiktoken, "
             "else var/tiktoken in the repository)",
    )
    parser.add_argument(
        "--wheel",
        type=Path,
        default=None,
        help=f"use an already downloaded litellm-{LITELLM_VERSION} wheel instead of running pip",
    )
    args = parser.parse_args(argv)
    dest: Path = (args.dest or default_dest()).expanduser()
    try:
        lines = install(dest, args.wheel)
    except InstallError as exc:
        print(f"install_tiktoken_data: error: {exc}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
