"""Safe spill and store files (issue 41, item 2): no file Tiga reads can hang it (a FIFO in
place of a chunk, zarr.json, CURRENT or manifest.json), nothing is read through a symbolic
link out of an array or a store, a declared shape is checked against the chunk files before
anything is allocated, and spill files go to private directories only.

Cases run in subprocesses (a hang is a timeout, not a stuck suite). Oracles: the numpy arrays
written, the modes and owners set on the file system (the suite runs as root, which no
permission bit stops, so the rules are checked on mode bits and uid), and what a planted link
points at, listed before and after."""
from __future__ import annotations

import pytest

from ._run import check_cases

pytest.importorskip("zarr", minversion="3.1")

HELPERS = '''
import atexit, os, shutil, stat, tempfile, threading
from pathlib import Path
ROOT = Path(tempfile.mkdtemp(prefix="tg-trust-"))
os.chdir(ROOT)
atexit.register(shutil.rmtree, ROOT, True)

def ring(n, k=3):
    rp = np.arange(n + 1, dtype=np.int64) * k
    ci = ((np.arange(n)[:, None] + np.arange(1, k + 1)) % n).reshape(-1).astype(np.int32)
    return rp, ci

def write_store(path, rp, ci, fields=(), chunk=50):
    n = len(rp) - 1
    with tg.store.create(path, num_src=n, num_dst=n) as w:
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            w.append_csr_chunk(rp[a:b + 1] - rp[a], ci[rp[a]:rp[b]])
        for name, rows, role in fields:
            w.append_field(name, rows, role=role)

def fifo_at(p):
    p = Path(p)
    if p.is_dir():
        shutil.rmtree(p)
    elif p.exists():
        p.unlink()
    os.mkfifo(p)

def within(seconds, fn):
    """fn() in a thread: its result or exception, or an AssertionError if it blocks."""
    out = {}
    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"blocked for {seconds} s (a FIFO opened blocking)"
    if "error" in out:
        raise out["error"]
    return out["value"]

def storage_error(fn, *needles):
    """fn() raises tg.StorageError (a TigaError) whose message holds every needle, without
    blocking."""
    try:
        within(30, fn)
    except tg.StorageError as exc:
        for n in needles:
            assert str(n) in str(exc), f"message lacks {n!r}: {exc}"
        return exc
    except AssertionError:
        raise
    except BaseException as exc:
        raise AssertionError(f"expected tg.StorageError, got {type(exc).__name__}: {exc}")
    raise AssertionError("expected tg.StorageError, nothing was raised")

X = np.random.default_rng(0).random((40, 3))
RP, CI = ring(200)
'''


def test_fifos_in_place_of_store_files_never_hang():
    check_cases(HELPERS + '''
@case
def fifo_chunk_of_a_saved_array():
    tg.save(X, "a")
    same(tg.load("a", tier="host"), X)
    chunk = next(p for p in Path("a/c").rglob("*") if p.is_file())
    fifo_at(chunk)
    storage_error(lambda: tg.load("a", tier="host"), chunk, "FIFO")
    storage_error(lambda: tg.load("a").numpy(), chunk, "FIFO")

@case
def fifo_zarr_json():
    tg.save(X, "b")
    fifo_at("b/zarr.json")
    storage_error(lambda: tg.load("b"), "zarr.json", "FIFO")

@case
def fifo_current_pointer():
    write_store("s1", RP, CI)
    fifo_at("s1/CURRENT")
    storage_error(lambda: tg.store.open("s1"), "CURRENT", "FIFO")
    storage_error(lambda: tg.Graph.open("s1"), "CURRENT", "FIFO")

@case
def fifo_manifest():
    write_store("s2", RP, CI)
    fifo_at(next(Path("s2").glob("v*/manifest.json")))
    storage_error(lambda: tg.store.open("s2"), "manifest.json", "FIFO")
    storage_error(lambda: tg.Graph.open("s2"), "manifest.json", "FIFO")

@case
def fifo_chunk_of_a_store_when_opened():
    write_store("s3", RP, CI)
    chunk = next(Path("s3").glob("v*/col_idx/c/0"))
    fifo_at(chunk)
    storage_error(lambda: tg.Graph.open("s3"), chunk, "FIFO")

@case
def fifo_chunk_replaced_under_a_paged_run():
    x = np.random.default_rng(1).random(200)
    write_store("s4", RP, CI)
    want = np.add.reduceat(x[CI], RP[:-1])

    def run(g):
        with tg.scope(page_rows=64, spill_dir=ROOT / "sp"):
            return np.asarray(tg.propagate(g, lambda s, d, e: s.x, tg.sum(), src={"x": x}))
    same(run(tg.Graph.open("s4")), want)            # the control: the store is whole
    g = tg.Graph.open("s4")                          # opened (checked) first, then damaged
    chunk = next(Path("s4").glob("v*/col_idx/c/0"))
    fifo_at(chunk)
    storage_error(lambda: run(g), chunk, "FIFO")
''', timeout=240)


def test_symbolic_links_never_lead_out_of_an_array_or_a_store():
    check_cases(HELPERS + '''
@case
def chunk_that_is_a_link_out_of_the_array():
    tg.save(X, "a")
    tg.save(X[::-1].copy(), "other")
    chunk = next(p for p in Path("a/c").rglob("*") if p.is_file())
    target = ROOT / "other" / chunk.relative_to("a")
    chunk.unlink()
    chunk.symlink_to(target)           # a whole, checksummed chunk of another array
    storage_error(lambda: tg.load("a", tier="host"), chunk, "symbolic link")

@case
def chunk_directory_that_is_a_link():
    tg.save(X, "b")
    tg.save(X[::-1].copy(), "other2")
    shutil.rmtree("b/c")
    os.symlink(ROOT / "other2" / "c", "b/c")
    storage_error(lambda: tg.load("b", tier="host"), "b/c", "symbolic link")

@case
def store_array_that_is_a_link_out_of_the_store():
    write_store("s1", RP, CI)
    write_store("s2", *ring(200, 3))
    col = next(Path("s1").glob("v*/col_idx"))
    shutil.rmtree(col)
    os.symlink(next(Path("s2").resolve().glob("v*/col_idx")), col)
    storage_error(lambda: tg.store.open("s1"), "col_idx", "outside")

@case
def a_link_the_user_names_is_still_followed():
    """Only what lies inside an array is held to this: tg.load of a path the user made a
    link to still reads the array there."""
    tg.save(X, "real")
    os.symlink(ROOT / "real", "alias")
    same(tg.load("alias", tier="host"), X)
''', timeout=180)


def test_declared_sizes_are_checked_before_anything_is_allocated():
    check_cases(HELPERS + '''
import json

def set_shape(path, shape, chunks=None):
    meta = Path(path) / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["shape"] = shape
    if chunks is not None:
        doc["chunk_grid"]["configuration"]["chunk_shape"] = chunks
    meta.write_text(json.dumps(doc))

@case
def shape_of_2_62_rows_on_the_host_tier():
    tg.save(X, "a")
    set_shape("a", [2**62, 3])
    storage_error(lambda: tg.load("a", tier="host"), "zarr.json", "chunk", "missing")
    storage_error(lambda: tg.load("a"), "zarr.json")

@case
def one_chunk_declared_2_40_rows():
    tg.save(X, "b")
    set_shape("b", [2**40, 3], [2**40, 3])
    storage_error(lambda: tg.load("b", tier="host"), "size check failed", "c/0/0")

@case
def a_few_rows_more_than_the_chunks_hold():
    tg.save(X, "c")
    doc = json.loads(Path("c/zarr.json").read_text())
    rows = doc["chunk_grid"]["configuration"]["chunk_shape"][0]
    set_shape("c", [rows + 1, 3])
    storage_error(lambda: tg.load("c", tier="host"), "chunk file missing", "c/1/0")

@case
def a_truncated_chunk_is_refused_at_open():
    tg.save(X, "d")
    chunk = Path("d/c/0/0")
    chunk.write_bytes(chunk.read_bytes()[:-9])
    storage_error(lambda: tg.load("d"), "d/c/0/0", "size check failed")
''', timeout=120)


def test_spill_directories_are_private():
    check_cases(HELPERS + '''
import tiga.xla_free_runtime.memory.scope as sc

def spilled_somewhere():
    d = tg.asarray(X).to("disk")
    return d, Path(d._storage.path)

@case
def default_spill_dir_is_mkdtemp_private_and_unpredictable():
    old = os.umask(0)
    try:
        d, path = spilled_somewhere()
    finally:
        os.umask(old)
    spill = path.parent
    st = os.lstat(spill)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
    assert st.st_uid == os.geteuid()
    assert spill.parent == Path(tempfile.gettempdir())
    assert spill.name.startswith("tiga-spill-") and spill.name != f"tiga-spill-{os.getpid()}"
    same(d.numpy(), X)

@case
def a_link_planted_at_the_old_fixed_name_is_not_followed():
    victim = ROOT / "victim"
    victim.mkdir()
    planted = Path(tempfile.gettempdir()) / f"tiga-spill-{os.getpid()}"
    if not os.path.lexists(planted):
        os.symlink(victim, planted)
    try:
        d, path = spilled_somewhere()
        assert list(victim.iterdir()) == [], "spill data landed behind the planted link"
        assert not str(path).startswith(str(planted) + "/")
    finally:
        if os.path.islink(planted):
            os.unlink(planted)

@case
def a_named_spill_dir_open_to_others_is_refused():
    for mode in (0o777, 0o775, 0o757):
        p = ROOT / f"open{mode:o}"
        p.mkdir()
        os.chmod(p, mode)
        def go():
            with tg.scope(spill_dir=p):
                tg.asarray(X).to("disk")
        storage_error(go, "spill_dir", str(p), "writable by its group or others",
                      f"{mode:04o}", "chmod go-w")
        assert list(p.iterdir()) == []

@case
def a_named_spill_dir_that_is_a_link_is_refused():
    real = ROOT / "real"
    real.mkdir(mode=0o700)
    os.symlink(real, ROOT / "link")
    def go():
        with tg.scope(spill_dir=ROOT / "link"):
            tg.asarray(X).to("disk")
    storage_error(go, "spill_dir", "symbolic link")

@case
def a_named_spill_dir_owned_by_another_user_is_refused():
    if os.geteuid() != 0:
        return                          # (chown needs root; CI and this suite run as root)
    p = ROOT / "theirs"
    p.mkdir(mode=0o700)
    os.chown(p, 54321, 54321)
    def go():
        with tg.scope(spill_dir=p):
            tg.asarray(X).to("disk")
    storage_error(go, "spill_dir", "owned by uid 54321")

@case
def a_named_missing_spill_dir_is_made_private():
    p = ROOT / "made" / "spill"
    old = os.umask(0)
    try:
        with tg.scope(spill_dir=p):
            d = tg.asarray(X).to("disk")
            assert Path(d._storage.path).parent == p
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(p).st_mode) == 0o700
    same(d.numpy(), X)

@case
def a_sticky_shared_spill_dir_gets_a_private_directory_inside():
    p = ROOT / "sticky"
    p.mkdir()
    os.chmod(p, 0o1777)
    with tg.scope(spill_dir=p):
        d = tg.asarray(X).to("disk")
        inner = Path(d._storage.path).parent
    assert inner.parent == p and inner.name.startswith("tiga-spill-")
    assert stat.S_IMODE(os.lstat(inner).st_mode) == 0o700
    same(d.numpy(), X)
''', timeout=120)
