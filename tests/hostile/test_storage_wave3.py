"""Hostile storage paths and store races (issue 27 items 6-8): tg.save never deletes what it
did not write, every storage path error is a tg.StorageError naming the path, store versions
are never shared between a transposed build and a writer, CURRENT must name a version of the
store, and a chunk copied from elsewhere is caught by the manifest's checksums.

Cases run in subprocesses (a working directory of their own, a hang is a timeout). Oracles:
the numpy arrays written, file listings and contents taken before the call, and numpy
gradients of the paged programs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tiga as tg

from ._run import check_cases

pytest.importorskip("zarr", minversion="3.1")

# helpers shared by the snippets: a tree's listing with file contents (the oracle that
# nothing was deleted or changed) and a store written from numpy arrays
HELPERS = '''
import atexit, os, shutil, tempfile
from pathlib import Path
ROOT = Path(tempfile.mkdtemp(prefix="tg-w3-"))
os.chdir(ROOT)
atexit.register(shutil.rmtree, ROOT, True)     # each case is a process: leave /tmp as found

def tree(p):
    p = Path(p)
    return sorted((str(q.relative_to(p)), q.read_bytes() if q.is_file() else None)
                  for q in p.rglob("*"))

def user_dir(p):
    p = Path(p)
    (p / "sub").mkdir(parents=True)
    (p / "notes.txt").write_text("mine")
    (p / "sub" / "data.bin").write_bytes(bytes(range(256)))
    return tree(p)

def ring(n, k=3):
    rp = np.arange(n + 1, dtype=np.int64) * k
    ci = ((np.arange(n)[:, None] + np.arange(1, k + 1)) % n).reshape(-1).astype(np.int32)
    return rp, ci

def write_store(path, rp, ci, fields=(), overwrite=False, chunk=50):
    n = len(rp) - 1
    with tg.store.create(path, num_src=n, num_dst=n, overwrite=overwrite) as w:
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            w.append_csr_chunk(rp[a:b + 1] - rp[a], ci[rp[a]:rp[b]])
        for name, rows, role in fields:
            w.append_field(name, rows, role=role)
    return w.version

X = np.random.default_rng(0).random((40, 3))
'''


def test_save_refuses_to_replace_what_it_did_not_write():
    check_cases(HELPERS + '''
@case
def unrelated_directory_is_never_replaced():
    before = user_dir("d")
    for ow in (False, True):
        raises(tg.StorageError, lambda: tg.save(X, "d", overwrite=ow), str(ROOT / "d"),
               "a directory holding other files", "notes.txt")
    assert tree("d") == before

@case
def working_directory_is_never_replaced():
    before = user_dir(ROOT / "w")
    os.chdir(ROOT / "w")
    try:
        for path in (os.getcwd(), ".", "", "./", "sub/.."):
            for ow in (False, True):
                raises(tg.StorageError, lambda: tg.save(X, path, overwrite=ow), "save:")
        assert tree(ROOT / "w") == before
    finally:
        os.chdir(ROOT)

@case
def store_and_paths_inside_it_are_never_replaced():
    rp, ci = ring(30)
    write_store("s", rp, ci, fields=[("x", X[:30], "src")])
    before = tree("s")
    for ow in (False, True):
        raises(tg.StorageError, lambda: tg.save(X, "s", overwrite=ow), str(ROOT / "s"),
               "a tg.store", "never")
        for inner in ("s/v000001", "s/v000001/fields/x", "s/v000001/new"):
            raises(tg.StorageError, lambda: tg.save(X, inner, overwrite=ow),
                   "inside the store", str(ROOT / "s"))
    for ow in (False, True):
        raises(tg.StorageError, lambda: tg.save(X, "s/beside", overwrite=ow),
               "inside the store")
    w = tg.store.create("ingesting", num_src=30, num_dst=30)    # before its first commit
    raises(tg.StorageError, lambda: tg.save(X, w.vdir / "x"), "inside the store")
    raises(tg.StorageError, lambda: tg.save(X, "ingesting/v000002"), "inside the store")
    w.abort()
    assert tree("s") == before
    st = tg.store.open("s")
    same(st["x"].numpy(), X[:30])
    same(st.read_csr()[1], ci)

@case
def regular_file_needs_overwrite():
    Path("f.bin").write_bytes(b"precious")
    raises(tg.StorageError, lambda: tg.save(X, "f.bin"), str(ROOT / "f.bin"),
           "a regular file of 8 bytes", "overwrite=True")
    assert Path("f.bin").read_bytes() == b"precious"
    tg.save(X, "f.bin", overwrite=True)
    same(tg.load("f.bin", tier="host").numpy(), X)

@case
def empty_directory_needs_overwrite():
    Path("e").mkdir()
    raises(tg.StorageError, lambda: tg.save(X, "e"), "an empty directory", "overwrite=True")
    assert Path("e").is_dir() and not list(Path("e").iterdir())
    tg.save(X, "e", overwrite=True)
    same(tg.load("e", tier="host").numpy(), X)

@case
def symbolic_link_is_replaced_only_with_overwrite_and_never_its_target():
    before = user_dir("target")
    os.symlink(ROOT / "target", "link")
    raises(tg.StorageError, lambda: tg.save(X, "link"), "a symbolic link", "overwrite=True")
    tg.save(X, "link", overwrite=True)
    assert not Path("link").is_symlink()
    same(tg.load("link", tier="host").numpy(), X)
    assert tree("target") == before

@case
def foreign_zarr_array_needs_overwrite():
    import zarr
    z = zarr.create_array(store=str(ROOT / "z"), shape=(4,), dtype="int16", fill_value=0)
    z[:] = np.arange(4, dtype=np.int16)
    raises(tg.StorageError, lambda: tg.save(X, "z"), "a zarr array tg.save did not write")
    same(np.asarray(zarr.open_array(str(ROOT / "z"))[:]), np.arange(4, dtype=np.int16))
    tg.save(X, "z", overwrite=True)
    same(tg.load("z", tier="host").numpy(), X)

@case
def saved_array_is_replaced_without_overwrite_unless_files_were_added():
    tg.save(X, "a")
    tg.save(2 * X, "a")
    same(tg.load("a", tier="host").numpy(), 2 * X)
    (ROOT / "a" / "README").write_text("a user's file beside the array")
    before = tree("a")
    for ow in (False, True):
        raises(tg.StorageError, lambda: tg.save(X, "a", overwrite=ow), "README")
    assert tree("a") == before
    (ROOT / "a" / "README").unlink()
    (ROOT / "a" / "c" / "mine.txt").write_text("hidden among the chunks")
    raises(tg.StorageError, lambda: tg.save(X, "a", overwrite=True), "other files")
    assert (ROOT / "a" / "c" / "mine.txt").exists()

@case
def no_temporaries_are_left_behind_by_a_refusal():
    Path("g.bin").write_bytes(b"x")
    names = sorted(os.listdir(ROOT))
    raises(tg.StorageError, lambda: tg.save(X, "g.bin"), "overwrite=True")
    assert sorted(os.listdir(ROOT)) == names
''')


def test_storage_path_errors_are_storage_errors_naming_the_path():
    check_cases(HELPERS + '''
@case
def save_to_an_empty_path():
    raises(tg.StorageError, lambda: tg.save(X, ""), "save: path ''", "names no")

@case
def save_with_a_path_that_is_not_a_path():
    raises(tg.StorageError, lambda: tg.save(X, 3), "save: path is a int")

@case
def save_under_a_regular_file():
    Path("plain.txt").write_text("x")
    raises(tg.StorageError, lambda: tg.save(X, "plain.txt/arr"), str(ROOT / "plain.txt"),
           "a file, not a directory")
    raises(tg.StorageError, lambda: tg.save(X, "plain.txt/deeper/arr"),
           str(ROOT / "plain.txt"), "a file, not a directory")
    assert Path("plain.txt").read_text() == "x"

@case
def load_a_regular_file():
    Path("plain2.txt").write_text("x")
    raises(tg.StorageError, lambda: tg.load("plain2.txt"), str(ROOT / "plain2.txt"),
           "a file, not a directory")

@case
def load_a_directory_a_store_a_group_and_bad_metadata():
    Path("emptydir").mkdir()
    raises(tg.StorageError, lambda: tg.load("emptydir"), "zarr.json: not found")
    rp, ci = ring(10)
    write_store("s2", rp, ci)
    raises(tg.StorageError, lambda: tg.load("s2"), "is a tg.store", "tg.store.open")
    import zarr
    zarr.create_group(str(ROOT / "grp"))
    raises(tg.StorageError, lambda: tg.load("grp"), "zarr.json", "not a zarr v3 array")
    tg.save(X, "bad")
    Path("bad/zarr.json").write_bytes(b"\\xff\\xfe not utf-8")
    raises(tg.StorageError, lambda: tg.load("bad"), "zarr.json", "metadata check failed")
    tg.save(X, "lie")
    meta = json.loads(Path("lie/zarr.json").read_text())
    meta["attributes"]["tiga_dtype"] = "int8"
    Path("lie/zarr.json").write_text(json.dumps(meta))
    raises(tg.StorageError, lambda: tg.load("lie"), "tiga_dtype is 'int8'", "float64")
    raises(tg.StorageError, lambda: tg.load(""), "load: path ''")

@case
def spill_dir_naming_a_file():
    Path("spillfile").write_text("x")
    raises(tg.StorageError, lambda: tg.scope(spill_dir="spillfile"), "spill_dir",
           "spillfile", "a file, not a directory")
    def enter_under_file():
        with tg.scope(spill_dir="spillfile/below"):
            pass
    raises(tg.StorageError, enter_under_file, "spill_dir", "spillfile/below")
    raises(tg.StorageError, lambda: tg.scope(spill_dir=""), "spill_dir")
    raises(tg.StorageError, lambda: tg.scope(spill_dir=5), "spill_dir")
    assert Path("spillfile").read_text() == "x"

@case
def spill_dir_removed_under_a_scope():
    import shutil
    with tg.scope(spill_dir=ROOT / "sp"):
        shutil.rmtree(ROOT / "sp")
        Path(ROOT / "sp").write_text("now a file")
        raises(tg.StorageError, lambda: tg.asarray(X).to("disk"), str(ROOT / "sp"))

@case
def store_paths_that_name_no_store():
    raises(tg.StorageError, lambda: tg.store.open(""), "tg.store.open: path is ''")
    raises(tg.StorageError, lambda: tg.Graph.open(5), "tg.store.open: path is 5")
    raises(tg.StorageError, lambda: tg.store.create(None, num_src=1, num_dst=1),
           "tg.store.create: path is None")
    Path("plain3.txt").write_text("x")
    raises(tg.StorageError, lambda: tg.store.open("plain3.txt"), "plain3.txt/CURRENT")
    raises(tg.StorageError, lambda: tg.store.create("plain3.txt", num_src=1, num_dst=1),
           "plain3.txt", "not a directory")
    raises(tg.StorageError, lambda: tg.store.create("plain3.txt/s", num_src=1, num_dst=1),
           "plain3.txt/s")
    assert Path("plain3.txt").read_text() == "x"

@case
def current_not_utf8():
    rp, ci = ring(10)
    write_store("s3", rp, ci)
    Path("s3/CURRENT").write_bytes(b"v00000\\xff\\n")
    for fn in (lambda: tg.store.open("s3"), lambda: tg.Graph.open("s3"),
               lambda: write_store("s3", rp, ci, overwrite=True)):
        raises(tg.StorageError, fn, "s3/CURRENT", "not UTF-8")
''')


def test_current_must_name_a_version_inside_the_store():
    check_cases(HELPERS + '''
rp, ci = ring(20)
rp2, ci2 = ring(20, k=2)
write_store("other", rp2, ci2)
write_store("s", rp, ci)

def pointing(text):
    Path("s/CURRENT").write_text(text)
    for fn in (lambda: tg.store.open("s"), lambda: tg.Graph.open("s")):
        raises(tg.StorageError, fn, "s/CURRENT", "pointer check failed")

@case
def relative_path_outside():
    pointing("../other/v000001\\n")

@case
def absolute_path():
    pointing(str(ROOT / "other" / "v000001") + "\\n")

@case
def not_a_version_name():
    pointing("v1\\n")
    pointing("v000001/../../other/v000001\\n")

@case
def symlinked_version():
    import shutil
    shutil.rmtree("s/v000001")
    os.symlink(ROOT / "other" / "v000001", "s/v000001")
    Path("s/CURRENT").write_text("v000001\\n")
    raises(tg.StorageError, lambda: tg.store.open("s"), "symbolic link", "inside")

@case
def manifest_copied_from_another_version():
    import shutil
    write_store("t", rp, ci)
    write_store("t", rp2, ci2, overwrite=True)       # v000002
    shutil.copy("t/v000001/manifest.json", "t/v000002/manifest.json")
    raises(tg.StorageError, lambda: tg.store.open("t"), "version check failed")
''')


def test_chunks_copied_from_elsewhere_are_detected():
    check_cases(HELPERS + '''
import json, shutil
from tiga.xla_free_runtime.memory.tiers import disk
disk.CHUNK_BYTES = 64          # several chunks per array
rp, ci = ring(60)
ci_b = ((np.arange(60)[:, None] * 7 + np.arange(3)) % 60).reshape(-1).astype(np.int32)
X60 = np.random.default_rng(1).random((60, 3))
write_store("a", rp, ci, fields=[("x", X60, "src")])
write_store("b", rp, ci_b, fields=[("x", X60[::-1].copy(), "src")])

def swap(rel, k):
    src = Path("b/v000001") / rel / "c" / str(k)
    dst = Path("a/v000001") / rel / "c" / str(k)
    if src.is_dir():
        shutil.rmtree(dst)
        shutil.copytree(src, dst)
    else:
        shutil.copy(src, dst)

@case
def the_swapped_chunks_are_valid_on_their_own():
    # the other store's chunk has a valid crc32c: only the manifest can tell
    for name in ("col_idx", "fields/x"):
        st = disk.DiskStorage.open(Path("b/v000001") / name)
        st.read()

@case
def col_idx_chunk_from_another_store():
    swap("col_idx", 1)
    st = tg.store.open("a")
    raises(tg.StorageError, lambda: st.read_csr(), "col_idx/c/1",
           "manifest checksum check failed")
    g = tg.Graph.open("a")
    raises(tg.StorageError, lambda: tg.propagate(g, lambda s, d, e: s.x, tg.sum(),
                                                src={"x": X60}), "col_idx/c/1")

@case
def field_chunk_from_another_store():
    swap("fields/x", 2)
    raises(tg.StorageError, lambda: tg.store.open("a")["x"].numpy(), "fields/x/c/2",
           "manifest checksum check failed")

@case
def chunk_from_an_older_version_of_the_same_store():
    write_store("c", rp, ci)
    write_store("c", rp, ci_b, overwrite=True)
    shutil.copy("c/v000001/col_idx/c/0", "c/v000002/col_idx/c/0")
    raises(tg.StorageError, lambda: tg.store.open("c").read_csr(), "col_idx/c/0",
           "manifest checksum check failed")

@case
def a_format_1_store_without_chunk_checksums_still_reads():
    import zlib
    write_store("old", rp, ci, fields=[("x", X60, "src")])
    man = Path("old/v000001/manifest.json")
    m = json.loads(man.read_text())
    m.pop("checksum")
    m["format"] = "tiga-store/1"
    for entry in list(m["arrays"].values()) + list(m["fields"].values()):
        entry.pop("crc32c")
    body = json.dumps(m, sort_keys=True)
    man.write_text(json.dumps(dict(m, checksum=zlib.crc32(body.encode())), sort_keys=True))
    st = tg.store.open("old")
    same(st.read_csr()[1], ci)
    same(st["x"].numpy(), X60)

@case
def an_untouched_store_reads_back():
    write_store("d", rp, ci, fields=[("x", X60, "src")])
    st = tg.store.open("d")
    same(st.read_csr()[0], rp)
    same(st.read_csr()[1], ci)
    same(st["x"].numpy(), X60)
    assert all("crc32c" in a for a in st.manifest["arrays"].values())
''')


# A paged tg.grad whose transposed build is paused (inside its distribution pass) while a
# writer claims and commits versions; the oracle gradient is numpy's.
RACE_IN_PROCESS = HELPERS + '''
import shutil
from tiga.xla_free_runtime.store import transpose as store_transpose, versions as store_versions
N = 300
rp, ci = ring(N)
rp2, ci2 = ring(N, k=2)
x = np.random.default_rng(2).random(N)

def want_grad(rp, ci):
    d = np.repeat(np.arange(N), np.diff(rp))
    y = np.zeros(N); np.add.at(y, d, x[ci])
    g = np.zeros(N); np.add.at(g, ci, 2 * y[d])
    return g

def grad(path):
    g = tg.Graph.open(path)
    f = lambda x: tg.math.sum(tg.propagate(g, lambda s, d, e: s.x, tg.sum(),
                                             src={"x": x}) ** 2)
    with tg.scope(page_rows=64):
        return np.asarray(tg.grad(f)(x))

REAL = store_transpose._distribute
def pausing(action):
    def hook(store, runs, *args):
        action(runs.parent.parent)          # (the build's version directory)
        return REAL(store, runs, *args)
    store_transpose._distribute = hook

@case
def writer_commits_twice_during_a_build():
    write_store("s", rp, ci)
    seen = {}
    def commit_twice(vdir):
        seen["build"] = vdir.name
        seen["writer"] = [write_store("s", rp2, ci2, overwrite=True) for _ in range(2)]
    pausing(commit_twice)
    try:
        raises(tg.StorageError, lambda: grad("s"), "s: version v000001 was replaced by",
               "open the store again")
    finally:
        store_transpose._distribute = REAL
    nums = {int(seen["build"][1:])} | set(seen["writer"])
    assert len(nums) == 3, seen                         # three distinct version numbers
    assert not (ROOT / "s" / seen["build"]).exists()     # the build left nothing behind
    assert sorted(os.listdir("s")) == ["CURRENT"] + [f"v{v:06d}" for v in seen["writer"]]
    st = tg.store.open("s")
    assert st.version == seen["writer"][-1] and st.transposed is None
    same(st.read_csr()[1], ci2)
    same(grad("s"), want_grad(rp2, ci2), rtol=1e-12)

@case
def writer_claims_during_a_build_and_commits_after_it():
    write_store("t", rp, ci)
    seen = {}
    def claim(vdir):
        seen["build"] = vdir.name
        w = tg.store.create("t", num_src=N, num_dst=N, overwrite=True)
        seen["w"] = w
        w.append_csr_chunk(rp2, ci2)
    pausing(claim)
    try:
        got = grad("t")                                  # the build commits first
    finally:
        store_transpose._distribute = REAL
    same(got, want_grad(rp, ci), rtol=1e-12)
    w = seen["w"]
    assert w.vdir.name != seen["build"], seen
    assert w.vdir.is_dir() and not (w.vdir / "manifest.json").exists()  # kept while held
    w.commit()
    st = tg.store.open("t")
    assert st.version == w.version
    same(st.read_csr()[1], ci2)
    same(grad("t"), want_grad(rp2, ci2), rtol=1e-12)

@case
def two_builds_of_one_version_share_the_first_committed():
    write_store("b2", rp, ci)
    seen = {}
    def other_build(vdir):
        store_transpose._distribute = REAL      # (one pause: the inner build runs through)
        seen["outer"] = vdir.name
        seen["inner_grad"] = grad("b2")
        seen["inner"] = tg.store.open("b2").version
    pausing(other_build)
    try:
        got = grad("b2")
    finally:
        store_transpose._distribute = REAL
    want = want_grad(rp, ci)
    same(got, want, rtol=1e-12)
    same(seen["inner_grad"], want, rtol=1e-12)
    st = tg.store.open("b2")
    assert st.version == seen["inner"] and st.transposed is not None, (st.version, seen)
    assert not (ROOT / "b2" / seen["outer"]).exists()   # the second build removed its own
    assert sorted(os.listdir("b2")) == ["CURRENT", "v000001", f"v{seen['inner']:06d}"]

@case
def a_killed_owner_s_version_is_reclaimed():
    # a directory nobody holds (its owner died: the kernel dropped its lock) is removed by
    # the next claim and its number used again; one held by a live owner is kept
    write_store("u", rp, ci)
    (ROOT / "u" / "v000002").mkdir()                   # a killed ingest's leftover
    (ROOT / "u" / "v000002" / "row_ptr").mkdir()
    live = store_versions.claim(ROOT / "u")
    assert live.number == 2 and not list(live.vdir.iterdir()), live.number
    w = tg.store.create("u", num_src=N, num_dst=N, overwrite=True)
    assert w.version == 3 and live.vdir.is_dir(), w.version
    w.abort()
    live.release()
    w = tg.store.create("u", num_src=N, num_dst=N, overwrite=True)
    assert w.version == 2, w.version
    w.append_csr_chunk(rp2, ci2)
    w.commit()
    assert sorted(os.listdir("u")) == ["CURRENT", "v000001", "v000002"]
    same(tg.store.open("u").read_csr()[1], ci2)
'''


def test_store_versions_during_a_transposed_build():
    check_cases(RACE_IN_PROCESS)


RACE_READER = '''
import sys, json, numpy as np, tiga as tg
path, N, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
x = np.random.default_rng(2).random(N)
out = {"ok": 0, "storage_errors": [], "other": []}
for _ in range(rounds):
    try:
        g = tg.Graph.open(path)
        rp, ci = g.resolve_csr()
        f = lambda x: tg.math.sum(tg.propagate(g, lambda s, d, e: s.x, tg.sum(),
                                                 src={"x": x}) ** 2)
        with tg.scope(page_rows=256):
            got = np.asarray(tg.grad(f)(x))
        d = np.repeat(np.arange(N), np.diff(rp))
        y = np.zeros(N); np.add.at(y, d, x[ci])
        want = np.zeros(N); np.add.at(want, ci, 2 * y[d])
        np.testing.assert_allclose(got, want, rtol=1e-12)
        out["ok"] += 1
    except tg.StorageError as exc:
        out["storage_errors"].append(str(exc)[:200])
    except BaseException as exc:
        import traceback
        out["other"].append(f"{type(exc).__name__}: {exc}\\n{traceback.format_exc()[-1500:]}")
print("RACE " + json.dumps(out), flush=True)
'''

RACE_WRITER = '''
import sys, json, numpy as np, tiga as tg
path, N, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
versions = []
for r in range(rounds):
    k = 2 + r % 3
    rp = np.arange(N + 1, dtype=np.int64) * k
    ci = ((np.arange(N)[:, None] * (r + 1) + np.arange(k)) % N).reshape(-1)
    with tg.store.create(path, num_src=N, num_dst=N, overwrite=True) as w:
        for a in range(0, N, 500):
            b = min(N, a + 500)
            w.append_csr_chunk(rp[a:b + 1] - rp[a], ci[rp[a]:rp[b]])
    versions.append(w.version)
print("RACE " + json.dumps(versions), flush=True)
'''


def _race_result(proc, timeout):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    line = [ln for ln in out.splitlines() if ln.startswith("RACE ")]
    assert line, out[-2000:] + err[-2000:]
    return json.loads(line[-1][5:])


def test_paged_grads_racing_a_writer_in_another_process(tmp_path):
    """Two processes on one store: paged tg.grad (each version's transposed relation built
    afresh) against a writer committing new versions. A grad either matches numpy's or is
    a StorageError; the writer's versions are distinct and the store it leaves reads
    back."""
    path, n = tmp_path / "s", 3000
    env = dict(os.environ, TIGA_PROGRESS="0", PYTHONFAULTHANDLER="1")
    seed = subprocess.run([sys.executable, "-c", RACE_WRITER, str(path), str(n), "1"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert seed.returncode == 0, seed.stderr[-3000:]
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(n), rounds],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)
             for code, rounds in ((RACE_READER, "8"), (RACE_WRITER, "12"))]
    try:
        reader, written = (_race_result(p, 240) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert not reader["other"], "\n".join(reader["other"])
    assert reader["ok"] + len(reader["storage_errors"]) == 8, reader
    assert len(set(written)) == len(written) == 12, written
    store = tg.store.open(path)
    if store.transposed is None:                       # (else a build of it came last)
        assert store.version == written[-1], (store.version, written)
    k, r = 2 + 11 % 3, 11                               # the writer's last round
    want = ((np.arange(n)[:, None] * (r + 1) + np.arange(k)) % n).reshape(-1)
    np.testing.assert_array_equal(store.read_csr()[1], want)
    names = sorted(os.listdir(path))
    assert names[0] == "CURRENT" and store.vdir.name in names, names
    # every version left is committed (a failed build leaves nothing behind) and complete:
    # its manifest's chunk checksums hold for every array
    for v in names[1:]:
        assert (path / v / "manifest.json").exists(), (v, names)
        st = tg.store.Store(path, v)
        st.read_csr()
        if st.transposed is not None:
            st.transposed.read_rows(0, st.transposed.num_dst)
            st.transposed.edge_perm.read()



def test_budget_errors_name_the_knob_that_fixes_them():
    """Issue 26 item 5: each budget StorageError names a fix, and following it works (the
    oracle of the fixed run is numpy)."""
    check_cases(HELPERS + '''
N, k = 20000, 3
rp, ci = ring(N, k)
write_store("big", rp, ci)
x = np.random.default_rng(3).random((N, 8))

@case
def page_buffers_over_budget_name_page_rows():
    g = tg.Graph.open("big")
    run = lambda: tg.propagate(g, lambda s, d, e: s.x, tg.sum(), src={"x": x})
    with tg.scope(budgets={"host": "256KiB"}, page_rows=65536):
        err = raises(tg.StorageError, run, "for page 0 ", "a smaller page_rows",
                     "now 65536", "budgets['host']")
        assert "eviction" not in str(err), err
    with tg.scope(budgets={"host": "256KiB"}, page_rows=1024):
        same(np.asarray(run()), x[ci].reshape(N, k, 8).sum(1))

@case
def idle_host_tensors_that_cover_the_request_suggest_lru():
    with tg.scope(budgets={"host": "100KiB"}):
        held = tg.asarray(x[:1000]).to("disk").to("host")          # 64000 idle bytes
        want = x[:700].copy()                                        # 44800 more
        err = raises(tg.StorageError, lambda: tg.asarray(want).to("disk").to("host"),
                     "eviction='lru' would spill", "62.50 KiB")
        with tg.scope(eviction="lru"):
            got = tg.asarray(want).to("disk").to("host")
        same(got.numpy(), want)
        assert held.tier == "disk"                                   # it was spilled

@case
def a_request_larger_than_the_budget_names_the_budget_and_the_disk_tier():
    tg.save(x, "xs")
    with tg.scope(budgets={"host": "100KiB"}, eviction="lru"):
        raises(tg.StorageError, lambda: tg.load("xs", tier="host"), "budgets['host']",
               "'disk' tier")
        same(tg.load("xs")[:10].numpy(), x[:10])                    # the disk tier works
''')
