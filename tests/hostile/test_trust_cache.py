"""A private artifact cache (issue 41, item 1): a cache entry is code Tiga runs (a Triton
module is exec'd, a cpu-llvm library dlopen'd), so only this user's Tiga may have written it.

The oracle is the file system itself: modes and owners are set explicitly (the suite runs as
root, which no permission bit stops, so the rules are checked on mode bits and uid, never on
an EACCES), and a planted module or library proves it ran by writing a marker file."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import warnings

import pytest

from tiga.xla_free_runtime.backends.cpu.native import jit
from tiga.xla_free_runtime.caches import artifacts
from tiga.xla_free_runtime.caches.artifacts import ArtifactCache, Built, CacheTrustWarning

from ._run import run_snippet

OTHER_UID = 54321          # a uid that is not this process's (chown needs root: skipped else)
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="chown to another uid needs root")


class Kind:
    """A test artifact kind whose load is counted: a load is the code-execution event."""

    kinds = ("test",)

    def __init__(self):
        self.builds, self.loads = [], []

    def build(self, key):
        self.builds.append(key)
        return Built(("built", key), "test", b"payload:" + key.encode(), {"n": 1})

    def load(self, key, kind, payload, meta, path):
        self.loads.append((key, payload))
        return ("loaded", key)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private cache directory and key location per test; warnings and keys not memoised
    across tests."""
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(artifacts, "_KEYS", {})
    artifacts._warn_once.cache_clear()      # each test sees its warnings, whatever ran before
    yield tmp_path
    artifacts._warn_once.cache_clear()      # and leaves none of its own remembered


def _mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def _written(key) -> tuple:
    store = ArtifactCache()
    store.get(key, Kind())
    assert store.stats.writes == 1, store.stats
    return store


def _fresh_get(key):
    """A new process's view: an empty memory layer asks the disk."""
    store, kind = ArtifactCache(), Kind()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        value = store.get(key, kind)
    trust = [str(w.message) for w in seen if issubclass(w.category, CacheTrustWarning)]
    return value, kind, store.stats, trust


# ---- what is created: private under any umask -------------------------------------------------

def test_directories_entries_and_key_are_private_even_under_umask_000(home):
    key = artifacts.artifact_key("umask", "test", ())
    old = os.umask(0)
    try:
        _written(key)
    finally:
        os.umask(old)
    entry = artifacts.entry_path(key)
    assert _mode(entry.parent.parent) == 0o700          # the cache directory
    assert _mode(entry.parent) == 0o700                 # its shard directory
    assert _mode(entry) == 0o600
    keyfile = artifacts.cache_key_path()
    assert keyfile == home / "config" / "tiga" / "cache-key"
    assert _mode(keyfile.parent) == 0o700 and _mode(keyfile) == 0o600
    assert os.lstat(keyfile).st_size == artifacts.KEY_BYTES
    assert os.lstat(entry).st_uid == os.geteuid()


def test_an_entry_this_user_wrote_is_loaded(home):
    """The control: the checks do not refuse what they should accept (else every test
    below would pass for the wrong reason)."""
    key = artifacts.artifact_key("control", "test", ())
    _written(key)
    value, kind, stats, trust = _fresh_get(key)
    assert value == ("loaded", key) and kind.builds == [] and stats.disk_hits == 1
    assert trust == []


# ---- entries another writer planted -------------------------------------------------------

def _forged(key: str, payload: bytes, secret: bytes) -> bytes:
    return artifacts.encode_entry(key, "test", payload, {"n": 1}, secret)


def test_entry_with_a_recomputed_checksum_but_another_key_is_never_loaded(home):
    """What 58b7cff trusted: the right key, kind, size and SHA-256, written by someone who
    does not hold this user's secret."""
    key = artifacts.artifact_key("planted", "test", ())
    _written(key)
    entry = artifacts.entry_path(key)
    entry.write_bytes(_forged(key, b"evil", os.urandom(artifacts.KEY_BYTES)))
    header = entry.read_bytes().split(b"\n", 1)[0]
    body = json.loads(header[header.index(b"{"):])
    assert body["sha256"] == hashlib.sha256(b"evil").hexdigest()   # a well-formed entry
    value, kind, stats, _ = _fresh_get(key)
    assert kind.loads == [] and value == ("built", key)
    assert stats.corrupt_discarded == 1 and stats.disk_hits == 0
    # the rebuilt entry replaced it and is this user's again
    value, kind, stats, _ = _fresh_get(key)
    assert value == ("loaded", key) and kind.loads == [(key, b"payload:" + key.encode())]


def test_entry_of_an_older_format_without_hmac_is_never_loaded(home):
    key = artifacts.artifact_key("old", "test", ())
    _written(key)
    payload = b"evil"
    header = json.dumps({"key": key, "kind": "test", "size": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest(), "meta": {"n": 1}},
                        sort_keys=True).encode()
    artifacts.entry_path(key).write_bytes(b"# tiga-artifact 2 " + header + b"\n" + payload)
    value, kind, stats, _ = _fresh_get(key)
    assert kind.loads == [] and stats.corrupt_discarded == 1


@needs_root
def test_entry_owned_by_another_user_is_refused_even_with_a_valid_hmac(home):
    key = artifacts.artifact_key("owner", "test", ())
    _written(key)
    entry = artifacts.entry_path(key)
    os.chown(entry, OTHER_UID, OTHER_UID)
    value, kind, stats, trust = _fresh_get(key)
    assert kind.loads == [] and value == ("built", key) and stats.corrupt_discarded == 1
    assert any(str(entry) in t and f"owned by uid {OTHER_UID}" in t for t in trust), trust


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_entry_writable_by_others_is_refused_even_with_a_valid_hmac(home, mode):
    key = artifacts.artifact_key(f"mode{mode}", "test", ())
    _written(key)
    entry = artifacts.entry_path(key)
    os.chmod(entry, mode)
    value, kind, stats, trust = _fresh_get(key)
    assert kind.loads == [] and stats.corrupt_discarded == 1
    assert any(str(entry) in t and f"{mode:04o}" in t for t in trust), trust


def test_symbolic_link_entry_is_never_followed(home):
    key = artifacts.artifact_key("link", "test", ())
    _written(key)
    entry = artifacts.entry_path(key)
    real = home / "elsewhere.tga"
    shutil.copy(entry, real)              # a whole entry this user's key made, elsewhere
    entry.unlink()
    entry.symlink_to(real)
    value, kind, stats, _ = _fresh_get(key)
    assert kind.loads == [] and stats.corrupt_discarded == 1
    assert not entry.is_symlink() and entry.is_file()   # the link gave way to a rebuilt entry
    assert real.exists()                                # the link was removed, not its target


# ---- directories that are not private: refused, with a warning, no disk cache ------------

@pytest.mark.parametrize("which", ["cache", "shard"])
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_writable_cache_directory_is_refused_with_a_warning(home, which, mode):
    key = artifacts.artifact_key(f"dir{which}{mode}", "test", ())
    _written(key)
    entry = artifacts.entry_path(key)
    d = entry.parent.parent if which == "cache" else entry.parent
    os.chmod(d, mode)
    before = entry.read_bytes()
    value, kind, stats, trust = _fresh_get(key)
    # nothing under it was read (no load, not even counted corrupt) or written
    assert kind.loads == [] and value == ("built", key)
    assert stats.disk_hits == 0 and stats.corrupt_discarded == 0 and stats.writes == 0
    assert stats.disk_write_errors == 1
    assert entry.read_bytes() == before
    assert len(trust) == 1, trust
    msg = trust[0]
    assert str(d) in msg and "writable by its group or others" in msg and "chmod 700" in msg
    assert "TIGA_CACHE_DIR" in msg
    # once per process: a second miss does not warn again
    assert _fresh_get(artifacts.artifact_key("again" + which, "test", ()))[3] == []


@needs_root
def test_cache_directory_owned_by_another_user_is_refused(home):
    key = artifacts.artifact_key("dirowner", "test", ())
    _written(key)
    root = artifacts.entry_path(key).parent.parent
    os.chown(root, OTHER_UID, OTHER_UID)
    value, kind, stats, trust = _fresh_get(key)
    assert kind.loads == [] and stats.disk_hits == 0
    assert any(str(root) in t and f"owned by uid {OTHER_UID}" in t for t in trust), trust


def test_cache_directory_that_is_a_symbolic_link_is_refused(home, monkeypatch):
    key = artifacts.artifact_key("dirlink", "test", ())
    _written(key)
    root = artifacts.entry_path(key).parent.parent
    link = home / "link"
    link.symlink_to(root)
    monkeypatch.setenv("TIGA_CACHE_DIR", str(link))
    value, kind, stats, trust = _fresh_get(key)
    assert kind.loads == [] and stats.disk_hits == 0
    assert any(str(link) in t and "symbolic link" in t for t in trust), trust


def test_missing_or_uncreatable_cache_directory_is_quiet(home, monkeypatch):
    blocker = home / "file"
    blocker.write_text("x")
    monkeypatch.setenv("TIGA_CACHE_DIR", str(blocker / "cache"))
    value, kind, stats, trust = _fresh_get(artifacts.artifact_key("quiet", "test", ()))
    assert value[0] == "built" and trust == [] and stats.disk_write_errors == 1


# ---- the key ---------------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["mode 0644", "mode 0660", "short", "link", "dir 0777",
                                    "fifo"])
def test_a_key_that_fails_its_checks_means_no_disk_cache(home, damage):
    key = artifacts.artifact_key("key" + damage, "test", ())
    _written(key)
    keyfile = artifacts.cache_key_path()
    if damage.startswith("mode"):
        os.chmod(keyfile, int(damage.split()[1], 8))
        needle = ("read by its group or others" if damage == "mode 0644" else
                  "writable by its group or others")
    elif damage == "short":
        keyfile.write_bytes(b"0123")
        needle = "not a 32-byte key"
    elif damage == "link":
        other = home / "other-key"
        other.write_bytes(os.urandom(artifacts.KEY_BYTES))
        os.chmod(other, 0o600)
        keyfile.unlink()
        keyfile.symlink_to(other)
        needle = "regular file"
    elif damage == "fifo":
        keyfile.unlink()
        os.mkfifo(keyfile, 0o600)
        needle = "not a regular file"
    else:
        os.chmod(keyfile.parent, 0o777)
        needle = "XDG_CONFIG_HOME"
    artifacts._KEYS.clear()           # (a new process)
    started = time.monotonic()
    value, kind, stats, trust = _fresh_get(key)
    assert time.monotonic() - started < 10          # (a FIFO key never blocks)
    assert kind.loads == [] and stats.disk_hits == 0 and stats.writes == 0
    assert any(needle in t for t in trust), (needle, trust)
    assert any("Fix:" in t for t in trust), trust


@needs_root
def test_a_key_owned_by_another_user_is_refused(home):
    key = artifacts.artifact_key("keyowner", "test", ())
    _written(key)
    os.chown(artifacts.cache_key_path(), OTHER_UID, OTHER_UID)
    artifacts._KEYS.clear()
    value, kind, stats, trust = _fresh_get(key)
    assert kind.loads == [] and stats.disk_hits == 0
    assert any(f"owned by uid {OTHER_UID}" in t for t in trust), trust


def test_two_processes_agree_on_one_key(home):
    """The key is linked in whole: concurrent first uses end with one key that both
    processes' entries verify under."""
    snippet = f'''
import os
os.environ["XDG_CONFIG_HOME"] = {str(home / "config")!r}
from tiga.xla_free_runtime.caches import artifacts
print("KEY", artifacts.cache_secret(create=True).hex(), flush=True)
'''
    procs = [subprocess.Popen([sys.executable, "-c", snippet], stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]
    keys = {p.communicate(timeout=120)[0].split("KEY ")[-1].strip() for p in procs}
    assert len(keys) == 1 and keys == {artifacts.cache_key_path().read_bytes().hex()}


# ---- the library loader's directory ----------------------------------------------------------

def test_library_is_written_only_where_nobody_else_can_swap_it(tmp_path):
    ok = tmp_path / "private"
    ok.mkdir(mode=0o700)
    assert jit._safe_dir(ok)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    assert not jit._safe_dir(shared)
    group = tmp_path / "group"
    group.mkdir()
    os.chmod(group, 0o775)
    assert not jit._safe_dir(group)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    assert jit._safe_dir(sticky)
    link = tmp_path / "link"
    link.symlink_to(ok)
    assert not jit._safe_dir(link)
    if os.geteuid() == 0:
        os.chown(ok, OTHER_UID, OTHER_UID)
        assert not jit._safe_dir(ok)


# ---- end to end: a planted module and a planted library do not run ---------------------------

PLANT = '''
import os, json, hashlib
from pathlib import Path
from tiga.xla_free_runtime.caches import artifacts
root = Path(os.environ["TIGA_CACHE_DIR"])
g = tg.Graph.from_csr(np.array([0, 2, 3, 3]), np.array([0, 1, 1]), num_src=2)
x = np.array([2.0, -3.0])

def run():
    return np.asarray(tg.propagate(g, lambda s, d, e: s.x * 1.5, tg.sum(), src={"x": x}))

want = [-1.5, -4.5, 0.0]
mode = os.environ["PLANT_MODE"]

@case
def first_run_writes_entries():
    same(run(), np.array(want))
    assert list(root.rglob("*.tga")), "no entry written"

if mode == "plant":
    # replace every entry's payload with the evil one, checksum recomputed, HMAC under a
    # key that is not this user's; the signature metadata kept, so only trust stops it
    for p in root.rglob("*.tga"):
        head, payload = p.read_bytes().split(b"\\n", 1)
        header = json.loads(head[head.index(b"{"):])
        evil = Path(os.environ["EVIL_" + header["kind"].replace("-", "_").upper()])
        if not evil.exists():
            continue
        data = artifacts.encode_entry(header["key"], header["kind"], evil.read_bytes(),
                                      header["meta"], os.urandom(32))
        p.write_bytes(data)
else:
    # the cache directory opened to everyone: entries are this user's, yet not read
    os.chmod(root, 0o777)
'''

SECOND = '''
import os, warnings
from pathlib import Path
g = tg.Graph.from_csr(np.array([0, 2, 3, 3]), np.array([0, 1, 1]), num_src=2)
x = np.array([2.0, -3.0])
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    y = np.asarray(tg.propagate(g, lambda s, d, e: s.x * 1.5, tg.sum(), src={"x": x}))
from tiga.xla_free_runtime.caches.executables import CACHE

@case
def the_result_is_right_and_nothing_planted_ran():
    same(y, np.array([-1.5, -4.5, 0.0]))
    assert not Path(os.environ["MARKER"]).exists(), "a planted artifact ran"
    assert CACHE.stats.disk_hits == 0, CACHE.stats

@case
def an_open_directory_is_named_in_a_warning():
    msgs = [str(w.message) for w in seen]
    if os.environ["PLANT_MODE"] == "open":
        assert any(os.environ["TIGA_CACHE_DIR"] in m and "chmod 700" in m for m in msgs), msgs
'''

EVIL_C = r'''
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(getenv("MARKER"), "w");
    if (f) { fputs("ran", f); fclose(f); }
}
'''


def _evil_library(tmp_path, marker):
    cc = jit.linker()
    if cc is None:
        pytest.skip("no C toolchain to build the planted library")
    src = tmp_path / "evil.c"
    src.write_text(EVIL_C)
    lib = tmp_path / "evil.so"
    subprocess.run(cc.split() + ["-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    # the control: the library does run its constructor when loaded
    subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(lib)!r})"],
                   env={**os.environ, "MARKER": str(marker)}, check=True)
    assert marker.read_text() == "ran"
    marker.unlink()
    return lib


@pytest.mark.parametrize("mode", ["plant", "open"])
@pytest.mark.parametrize("backend", ["cpu-llvm", "triton-interpreter"])
def test_planted_module_and_library_never_run(tmp_path, mode, backend):
    if backend.startswith("triton"):
        pytest.importorskip("triton")
    marker = tmp_path / "ran"
    lib = _evil_library(tmp_path, marker) if backend == "cpu-llvm" else tmp_path / "none"
    module = tmp_path / "evil.py"
    module.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env = {"TIGA_CACHE_DIR": str(tmp_path / "cache"), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
           "TIGA_BACKEND": backend, "PLANT_MODE": mode, "MARKER": str(marker),
           "EVIL_SO": str(lib), "EVIL_TRITON_SOURCE": str(module)}
    if backend.startswith("triton"):
        env["TRITON_INTERPRET"] = "1"
    first = run_snippet(PLANT, env=env, timeout=240)
    assert not first.timed_out and first.rc == 0, first.describe()
    assert first.results and set(first.results.values()) == {"ok"}, first.results
    if mode == "plant":
        planted = [p for p in (tmp_path / "cache").rglob("*.tga")
                   if b"ran" in p.read_bytes() or b"planted" in p.read_bytes()]
        assert planted, "nothing was planted"
    second = run_snippet(SECOND, env=env, timeout=240)
    assert not second.timed_out and second.rc == 0, second.describe()
    failed = {k: v for k, v in second.results.items() if v != "ok"}
    assert second.results and not failed, failed


def test_status_says_disk_only_where_an_entry_may_be_read(home):
    key = artifacts.artifact_key("status", "test", ())
    _written(key)
    store = ArtifactCache()
    assert store.status(key) == "disk"
    os.chmod(artifacts.entry_path(key).parent, 0o777)
    assert store.status(key) == "miss"
