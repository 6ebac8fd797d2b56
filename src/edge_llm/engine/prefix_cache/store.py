"""The persistent prefix cache on disk (`--prefix-cache-dir`): entry files, their index by token prefix, the disk
budget. No llama.cpp: the KV state is opaque bytes here (engine/llama/kv_state.py makes and takes them).

An entry is one file, `<sha256 of its tokens>.kv`:

    magic "EDGEKV\\0\\1" | header length (u32 LE) | header (JSON) | tokens (int32 LE) | state (llama.cpp's bytes)

The header holds the fingerprint (the model file and the KV settings the state was made with), the token and
state sizes and a SHA-256 of tokens + state. At start-up only headers and tokens are read (the index); the state
is read, and its checksum checked, when an entry is first used. An entry of another fingerprint is foreign: left
alone, never loaded, not counted in the budget. One that is truncated or damaged is deleted with a warning. A
write goes to a temporary file that is fsynced and then renamed into place, so a kill during a save leaves a
`.tmp` file (removed at the next start) and never a half entry. Least recently used entries (a use touches the
file's mtime, so the order survives restarts) are deleted when the entries pass the budget.

Thread-safety: the engine thread looks entries up and loads them, the writer thread writes and evicts; the index
is guarded by one lock, and file reads of an entry being evicted fail like any damaged read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from edge_llm.engine.scheduling.token_match import common_prefix_length

logger = logging.getLogger(__name__)

MAGIC = b"EDGEKV\x00\x01"
SUFFIX = ".kv"
TMP_SUFFIX = ".tmp"
KEY_TOKENS = 32  # entries are found by their first tokens: shorter common prefixes are not worth a load
_HEADER_LIMIT = 1 << 16
_SAMPLE = 1 << 20  # bytes hashed at each end of the model file


class EntryError(Exception):
    """An entry file that must not be loaded (damaged, truncated, foreign)."""


def kv_fingerprint(model: Path, *, cache_type_k: str, cache_type_v: str, flash_attn: str,
                   deterministic: bool = False) -> str:
    """What a saved state depends on: the model file (its size and a hash of its first and last MiB: cheap, and the
    same for a copy), the KV cache types, flash attention (it decides whether V is stored transposed), the
    llama-cpp-python version (its llama.cpp's state format) and --deterministic (its kernels round otherwise: a state
    saved without it would make a deterministic answer depend on the disk). The context size is not part of it: a
    state is a list of cells that any context with that many free cells takes."""
    digest = hashlib.sha256()
    size = model.stat().st_size
    with model.open("rb") as file:
        digest.update(file.read(_SAMPLE))
        file.seek(max(0, size - _SAMPLE))
        digest.update(file.read(_SAMPLE))
    try:
        llama_version = metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        llama_version = "unknown"
    facts = {"model_size": size, "model_sample": digest.hexdigest(), "type_k": cache_type_k, "type_v": cache_type_v,
             "flash_attn": flash_attn, "llama_cpp_python": llama_version, "format": 1}
    if deterministic:  # (absent otherwise, so the caches saved before the flag existed stay valid)
        facts["deterministic"] = True
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def entry_name(tokens: Sequence[int]) -> str:
    return hashlib.sha256(_token_bytes(tokens)).hexdigest()[:40] + SUFFIX


def _token_bytes(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


def encode_entry(fingerprint: str, tokens: Sequence[int], state: bytes) -> tuple[bytes, bytes]:
    """The file's bytes as (head: magic, header and tokens; state)."""
    token_bytes = _token_bytes(tokens)
    checksum = hashlib.sha256(token_bytes)
    checksum.update(state)
    header = json.dumps({"fingerprint": fingerprint, "n_tokens": len(tokens), "state_bytes": len(state),
                         "sha256": checksum.hexdigest(), "created": time.time()}).encode()
    return MAGIC + struct.pack("<I", len(header)) + header + token_bytes, state


@dataclass(frozen=True)
class EntryHeader:
    fingerprint: str
    tokens: tuple[int, ...]
    state_offset: int
    state_bytes: int
    sha256: str


def read_header(path: Path) -> EntryHeader:
    """The header and tokens of an entry file, checked against the file's size; EntryError when it is not one."""
    try:
        with path.open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            if file.read(len(MAGIC)) != MAGIC:
                raise EntryError("not an entry file (bad magic bytes)")
            (header_length,) = struct.unpack("<I", _read_exactly(file, 4))
            if header_length > _HEADER_LIMIT:
                raise EntryError("damaged header")
            header = json.loads(_read_exactly(file, header_length))
            n_tokens, state_bytes = int(header["n_tokens"]), int(header["state_bytes"])
            state_offset = len(MAGIC) + 4 + header_length + 4 * n_tokens
            if n_tokens <= 0 or state_bytes <= 0 or size != state_offset + state_bytes:
                raise EntryError(f"truncated or damaged ({size} bytes, its header says {state_offset + state_bytes})")
            tokens = struct.unpack(f"<{n_tokens}i", _read_exactly(file, 4 * n_tokens))
            return EntryHeader(str(header["fingerprint"]), tokens, state_offset, state_bytes, str(header["sha256"]))
    except EntryError:
        raise
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise EntryError(f"unreadable ({exc.__class__.__name__}: {exc})") from None


def read_state(path: Path, header: EntryHeader) -> bytes:
    """The entry's KV state, after its size and checksum (over tokens and state) are checked; EntryError if not."""
    try:
        with path.open("rb") as file:
            file.seek(header.state_offset - 4 * len(header.tokens))
            token_bytes = _read_exactly(file, 4 * len(header.tokens))
            state = _read_exactly(file, header.state_bytes)
            if file.read(1):
                raise EntryError("longer than its header says")
    except OSError as exc:
        raise EntryError(f"unreadable ({exc})") from None
    checksum = hashlib.sha256(token_bytes)
    checksum.update(state)
    if checksum.hexdigest() != header.sha256 or token_bytes != _token_bytes(header.tokens):
        raise EntryError("checksum mismatch (damaged)")
    return state


def _read_exactly(file, n: int) -> bytes:  # type: ignore[no-untyped-def]
    data = file.read(n)
    if len(data) != n:
        raise EntryError(f"truncated ({len(data)} of {n} bytes)")
    return data


@dataclass
class StoredEntry:
    name: str
    header: EntryHeader
    file_bytes: int
    last_used: float

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.header.tokens


class PrefixStore:
    def __init__(self, directory: Path, fingerprint: str, *, budget_bytes: int) -> None:
        self.directory = directory
        self.fingerprint = fingerprint
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._entries: dict[str, StoredEntry] = {}
        self._by_key: dict[tuple[int, ...], set[str]] = {}
        self.counts = {"saved": 0, "loaded": 0, "rejected": 0, "evicted": 0, "evicted_before_save": 0}  # since start

    # ---- start-up --------------------------------------------------------------------------

    def scan(self) -> None:
        """Reads the index (headers and tokens), deletes leftover temporary files and damaged entries, skips
        foreign ones, and evicts beyond the budget."""
        self.directory.mkdir(parents=True, exist_ok=True)
        foreign = 0
        for path in sorted(self.directory.iterdir()):
            if path.name.endswith(TMP_SUFFIX):
                logger.info("removing %s, a save that did not finish", path.name)
                _unlink(path)
                continue
            if not path.name.endswith(SUFFIX) or not path.is_file():
                continue
            try:
                header = read_header(path)
            except EntryError as exc:
                self._reject(path, str(exc))
                continue
            if header.fingerprint != self.fingerprint:
                foreign += 1
                continue
            stat = path.stat()
            self._add(StoredEntry(path.name, header, stat.st_size, stat.st_mtime))
        if foreign:
            logger.warning("%d entries in %s belong to another model file or KV settings: ignored", foreign,
                           self.directory)
        with self._lock:
            self._evict_beyond_budget(keep=None)
        logger.info("persistent prefix cache: %d entries, %.1f MiB in %s", len(self._entries),
                    self.used_bytes / 2**20, self.directory)

    # ---- lookups (engine thread) ----------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return sum(entry.file_bytes for entry in list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def best_match(self, tokens: Sequence[int]) -> tuple[StoredEntry, int] | None:
        """The entry sharing the longest prefix with `tokens` (at least KEY_TOKENS), and that length."""
        if len(tokens) < KEY_TOKENS:
            return None
        with self._lock:
            candidates = [self._entries[name] for name in self._by_key.get(tuple(tokens[:KEY_TOKENS]), ())]
        best: tuple[StoredEntry, int] | None = None
        for entry in candidates:
            length = common_prefix_length(entry.tokens, tokens)
            if best is None or length > best[1]:
                best = (entry, length)
        return best

    def load(self, entry: StoredEntry) -> bytes | None:
        """The entry's verified state, its use recorded; None (with a warning, the file deleted) when it fails the
        checks."""
        path = self.directory / entry.name
        with self._lock:
            if self._entries.get(entry.name) is not entry:
                return None  # evicted or replaced by the writer since it was found
        try:
            state = read_state(path, entry.header)
        except EntryError as exc:
            with self._lock:
                self._drop(entry.name)
            self._reject(path, str(exc))
            return None
        now = time.time()
        entry.last_used = now
        try:
            os.utime(path, (now, now))
        except OSError:
            pass
        self.counts["loaded"] += 1
        return state

    # ---- writes (writer thread) ---------------------------------------------------------------------

    def write(self, tokens: tuple[int, ...], state: bytes) -> bool:
        """Saves an entry atomically (temporary file, fsync, rename, fsync of the directory); entries it covers
        (their tokens a prefix of its) are deleted, then the least recently used beyond the budget. False when the
        entry alone is larger than the budget."""
        head, body = encode_entry(self.fingerprint, tokens, state)
        size = len(head) + len(body)
        if size > self.budget_bytes:
            logger.info("not saving a prefix of %d tokens: %d bytes is more than the disk budget", len(tokens), size)
            return False
        name = entry_name(tokens)
        final = self.directory / name
        temporary = self.directory / (name + TMP_SUFFIX)
        with temporary.open("wb") as file:
            file.write(head)
            file.write(body)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, final)
        _fsync_directory(self.directory)
        header = read_header(final)
        with self._lock:
            self._drop(name)
            self._add(StoredEntry(name, header, size, time.time()))
            for other in list(self._entries.values()):
                if other.name != name and other.tokens == tokens[:len(other.tokens)]:
                    self._delete(other.name, "covered by a longer entry")
            self._evict_beyond_budget(keep=name)
        self.counts["saved"] += 1
        return True

    # ---- the index --------------------------------------------------------------------------------

    def _add(self, entry: StoredEntry) -> None:
        self._entries[entry.name] = entry
        if len(entry.tokens) >= KEY_TOKENS:
            self._by_key.setdefault(entry.tokens[:KEY_TOKENS], set()).add(entry.name)

    def _drop(self, name: str) -> StoredEntry | None:
        entry = self._entries.pop(name, None)
        if entry is not None and len(entry.tokens) >= KEY_TOKENS:
            names = self._by_key.get(entry.tokens[:KEY_TOKENS])
            if names is not None:
                names.discard(name)
                if not names:
                    del self._by_key[entry.tokens[:KEY_TOKENS]]
        return entry

    def _delete(self, name: str, why: str) -> None:
        if self._drop(name) is not None:
            logger.debug("deleting prefix-cache entry %s: %s", name, why)
            _unlink(self.directory / name)
            self.counts["evicted"] += 1

    def _evict_beyond_budget(self, keep: str | None) -> None:
        """Least recently used first; `keep` (just written) goes last."""
        order = sorted(self._entries.values(), key=lambda e: (e.name == keep, e.last_used))
        used = sum(entry.file_bytes for entry in order)
        for entry in order:
            if used <= self.budget_bytes:
                break
            self._delete(entry.name, "beyond the disk budget")
            used -= entry.file_bytes

    def _reject(self, path: Path, why: str) -> None:
        logger.warning("prefix-cache entry %s is %s: ignored and deleted", path.name, why)
        self.counts["rejected"] += 1
        _unlink(path)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("cannot delete %s: %s", path, exc)


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
