"""runtime: the disk cache of rendered Triton modules, `$TIGA_CACHE_DIR/triton/<key>.py`.

Triton compiles a kernel from its source file, so every rendered module lives on disk; a
later process that needs the same kernel imports the stored file instead of rendering it
again. The key is the printed `gf_kernel.launch` op (computation and schedule) plus what
the renderer reads beside it (the walk, an edge permutation), the backend, triton's version
and Tiga's own lowering sources (cache.tiga_key). A file is trusted only when its header
names the key and the SHA-256 of its body matches; anything else (truncated, garbled, an
old format) is discarded and rewritten, never imported.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ...cache import cache_dir, tiga_key

_MAGIC = "# tiga triton module v1"
STATS = {"disk_hits": 0, "writes": 0, "corrupt": 0}


def module_key(op_text: str, extra: tuple, backend: str, triton_version: str) -> str:
    parts = (op_text, repr(extra), backend, triton_version, tiga_key())
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def path_of(key: str) -> Path:
    return cache_dir() / "triton" / f"{key}.py"


def _header(key: str, body: str) -> str:
    digest = hashlib.sha256(body.encode()).hexdigest()
    return f"{_MAGIC}\n# key: {key}\n# sha256: {digest}\n"


def load(key: str):
    """(source text, signature dict) stored under `key`, or None (absent or corrupt: a
    corrupt entry is removed and counted)."""
    path = path_of(key)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        return _discard(path)
    lines = text.split("\n", 3)
    if len(lines) < 4 or not text.startswith(_header(key, lines[3])):
        return _discard(path)
    body = lines[3]
    first, _, source = body.partition("\n")
    if not first.startswith("# signature: "):
        return _discard(path)
    try:
        signature = json.loads(first[len("# signature: "):])
        compile(source, str(path), "exec")    # the body must be Python Triton can read
    except (ValueError, SyntaxError):
        return _discard(path)
    STATS["disk_hits"] += 1
    return text, signature


def store(key: str, source_text: str, signature_json: str) -> str:
    """Write the module (header, signature, source); returns the full file text."""
    body = f"# signature: {signature_json}\n{source_text}"
    text = _header(key, body) + body
    write(key, text)
    return text


def write(key: str, text: str) -> None:
    """Atomically (write, rename): a reader sees the old file or the new one."""
    path = path_of(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    STATS["writes"] += 1


def _discard(path: Path) -> None:
    STATS["corrupt"] += 1
    try:
        path.unlink()
    except OSError:
        pass
    return None
