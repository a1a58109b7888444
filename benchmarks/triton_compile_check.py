"""Compile every Triton propagate kernel in a Tiga disk cache for a CUDA target without a GPU:
Triton's own compiler (the wheel ships ptxas) runs every pass the device would, down to a
cubin, so a kernel that the interpreter runs but the GPU compiler rejects (the 2026-11-26
H100 run: TritonGPURemoveLayoutConversions on the 2-D radius kernel under Triton 3.6) is
found on a CPU-only host, under whichever Triton runs this script (a venv holding only the
device image's Triton and numpy will do: tiga is not imported).

    TIGA_CACHE_DIR=/tmp/c python -m pytest tests/triton ...     # fill a cache (interpreter)
    python benchmarks/triton_compile_check.py /tmp/c [--arch 90] [--json out.json]

Each cached module's main kernel is compiled with the argument types its signature gives
(pointer arguments assumed 16-byte aligned, as Triton specialises them at launch; radius
coordinates float64, as tests/gpu makes them). The fixed modules are compiled at the GPU
check's shapes (benchmarks/gpu.py) with the blocks lower/schedule.py gives a GPU: the
attention kernels (lower/triton/attention.py: forward, dK/dV, dQ; 4 heads of 64, float16
and float32 operands) and the entity-level linear layer (lower/triton/linear.py:
tile_matmul, 32 x 32 weights, float16 and float32). The line per kernel says ok (whether
its loads include 128-bit vectors, whether its products run on tensor cores (mma), its
shared memory) or the compiler's error; a kernel whose shared memory exceeds what one
block may take on the target (227 KB on sm_90) fails, as its launch would. Exit status 1 if
any failed. The kNN lists' knn_tiles kernels (lower/triton/knn_tiles.py) are compiled for
float32 and float64 coordinates; the full-scan kNN selection is skipped.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import re
import sys
import tempfile

TL = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
      "int32": "i32", "int64": "i64", "int16": "i16", "int8": "i8", "uint8": "u8"}
COORDS = {"wpos", "wqpos", "grid_lo", "walk_scal"}


def kernels(cache: str) -> list:
    """(file, kernel name, source text, {arg: triton type}, constexprs, num_warps)."""
    out = []
    # (the artifact cache's entries: `# tiga-artifact 2 <JSON header>`, then the payload)
    for path in sorted(glob.glob(os.path.join(cache, "*", "*.tga"))):
        with open(path, "rb") as f:
            first, _, payload = f.read().partition(b"\n")
        if not first.startswith(b"# tiga-artifact 2 "):
            continue
        header = json.loads(first[len(b"# tiga-artifact 2 "):])
        if header.get("kind") != "triton-source" or not header["meta"].get("signature"):
            continue
        text = payload.decode()
        sig = json.loads(header["meta"]["signature"])
        if not sig.get("slots") or f"def {sig['symbol']}(" not in text:
            continue
        args = re.search(rf"^def {sig['symbol']}\((.*)\):", text, re.M).group(1)
        dtypes = {f"field{i}": d for i, d in enumerate(sig["field_dtypes"])}
        dtypes.update({f"out{k}": d for k, d in enumerate(sig["out_dtypes"])})
        dtypes["col_idx"] = sig["index_dtype"]
        types = {}
        for a in (a.split(":")[0].strip() for a in args.split(",")):
            if a in ("BLOCK_R", "BLOCK_N"):
                types[a] = "constexpr"
            elif a == "n_rows":
                types[a] = "i32"
            else:   # (walk tables: int64; radius coordinates and scalars: float64)
                types[a] = "*" + TL[dtypes.get(a, "float64" if a in COORDS else "int64")]
        out.append((os.path.basename(path), sig["symbol"], text, types,
                    {"BLOCK_R": sig["block_rows"], "BLOCK_N": sig["block_neighbors"]},
                    sig["num_warps"]))
    return out


# the GPU blocks of lower/schedule.py (triton_attention_blocks, triton_matmul_blocks) at the
# GPU check's shapes, for a Triton-only venv where tiga cannot be imported
ATTENTION_BLOCKS = {"float16": (128, 64, 8, 2), "float32": (64, 32, 4, 2)}
MATMUL_BLOCKS = {"float16": (64, 32, 32, 4, 3), "float32": (64, 32, 32, 4, 2)}
SHARED_LIMIT = {90: 232448, 80: 166912, 86: 101376, 89: 101376}   # bytes per block
HEAD, WIDTH = 64, 32      # attention head width; the linear layer's K and N (gpu.py)
ATTN_ARGS = {
    "attn_fwd": "q k v scale_ptr lo_ptr hi_ptr o top mass_ptr nq nk H",
    "attn_bwd_kv": "q k v do lse delta scale_ptr lo_ptr hi_ptr qlo_ptr qhi_ptr dk dv nq nk H",
    "attn_bwd_q": "q k v do lse delta scale_ptr lo_ptr hi_ptr dq nq nk H"}


def _schedule_blocks() -> tuple:
    """(attention, matmul) blocks from tiga's schedule where tiga imports, else the table."""
    try:
        from tiga.lower.schedule import triton_attention_blocks, triton_matmul_blocks
    except Exception:   # noqa: BLE001 - a Triton-only venv
        return ATTENTION_BLOCKS, MATMUL_BLOCKS
    return ({d: triton_attention_blocks(n, HEAD, False) for d, n in
             (("float16", 2), ("float32", 4))},
            {d: triton_matmul_blocks(1 << 17, WIDTH, WIDTH, n, False) for d, n in
             (("float16", 2), ("float32", 4))})


def fixed_kernels(cache: str) -> list:
    """The attention and linear modules of the cache, as kernels() rows per dtype."""
    attn, mm = _schedule_blocks()
    out = []
    for name, text in _sources(cache):
        if text.startswith("# generated by tiga (lower/triton/attention.py)"):
            for dt in ("float16", "float32"):
                bm, bn, warps, stages = attn[dt]
                for kern, args in ATTN_ARGS.items():
                    block_m = bm if kern == "attn_fwd" else min(bm, 64)
                    out.append((f"{name[:12]}:{kern}:{TL[dt]}", kern, text,
                                _attn_types(args.split(), dt),
                                dict(D=HEAD, DV=HEAD, BD=HEAD, BDV=HEAD, CT="fp32", IT=dt,
                                     PREC="ieee", BLOCK_M=block_m, BLOCK_N=bn),
                                (warps, stages)))
        elif text.startswith("# generated by tiga (lower/triton/knn_tiles.py)"):
            for dt in ("float32", "float64"):
                types = {a: "*" + TL[dt] for a in ("pos", "qpos")}
                types.update({a: "*i64" for a in ("cols", "cell_start", "cell_order",
                                                   "row_order")})
                types.update(grid_lo="*fp64", grid_dims="*i64", walk_scal="*fp64",
                             n_rows="i32", n_src="i32", K="i32")
                out.append((f"{name[:12]}:knn_tiles:{TL[dt]}", "knn_tiles", text, types,
                            dict(EXCL=True, PT=dt, BLOCK_R=16, BLOCK=64), (4, None)))
        elif text.startswith("# generated by tiga (lower/triton/linear.py)"):
            for dt in ("float16", "float32"):
                bm, bn, bk, warps, stages = mm[dt]
                types = {a: "*" + TL[dt] for a in ("a", "b", "c")}
                types.update({a: "i32" for a in "M N K sam sak sbk sbn".split()})
                out.append((f"{name[:12]}:tile_matmul:{TL[dt]}", "tile_matmul", text, types,
                            dict(IT=dt, CT="fp32", PREC="ieee", BLOCK_M=bm, BLOCK_N=bn,
                                 BLOCK_K=bk), (warps, stages)))
    return out


def _sources(cache: str):
    """(entry file name, source text) of the cache's Triton modules."""
    for path in sorted(glob.glob(os.path.join(cache, "*", "*.tga"))):
        with open(path, "rb") as f:
            first, _, payload = f.read().partition(b"\n")
        if first.startswith(b"# tiga-artifact 2 ") and \
                json.loads(first[len(b"# tiga-artifact 2 "):]).get("kind") == "triton-source":
            yield os.path.basename(path), payload.decode()


def _attn_types(args: list, dt: str) -> dict:
    types = {}
    for a in args:
        if a in ("nq", "nk", "H"):
            types[a] = "i32"
        elif a.endswith("_ptr") and a not in ("scale_ptr", "mass_ptr"):
            types[a] = "*i64"            # (row ranges)
        elif a in ("q", "k", "v", "do", "o", "dq", "dk", "dv"):
            types[a] = "*" + TL[dt]
        else:
            types[a] = "*fp32"           # (scale, statistics: the compute type)
    return types


def compile_one(text: str, symbol: str, types: dict, consts: dict, warps, arch: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    path = os.path.join(tempfile.mkdtemp(prefix="tiga-compile-"), f"{symbol}.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(symbol, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import triton.language as tl

    # (dtype constexprs as Triton types; the signature lists constexprs too)
    consts = {k: getattr(tl, {"fp32": "float32"}.get(v, v)) if k in ("IT", "CT", "PT")
              else v for k, v in consts.items()}
    types = dict(types, **{k: "constexpr" for k in consts})
    names = list(types)
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names)
             if types[a].startswith("*")}
    warps, stages = warps if isinstance(warps, tuple) else (warps, None)
    options = {"num_warps": warps, **({"num_stages": stages} if stages else {})}
    return triton.compile(ASTSource(fn=getattr(module, symbol), signature=types,
                                    constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32), options=options)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache", help="a TIGA_CACHE_DIR")
    ap.add_argument("--arch", type=int, default=90, help="compute capability (90: H100)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "0"   # (before triton is imported: compiled kernels)
    import triton

    rows = []
    limit = SHARED_LIMIT.get(args.arch)
    for name, symbol, text, types, consts, warps in \
            kernels(args.cache) + fixed_kernels(args.cache):
        try:
            done = compile_one(text, symbol, types, consts, warps, args.arch)
            ptx, shared = done.asm["ptx"], int(getattr(done.metadata, "shared", 0) or 0)
            over = limit is not None and shared > limit
            rows.append({"file": name, "ok": not over, "v4": "ld.global.v4" in ptx,
                         "mma": "mma" in ptx, "shared": shared})
            if over:
                rows[-1]["error"] = f"shared memory {shared} B over sm_{args.arch}'s {limit} B"
        except Exception as exc:   # noqa: BLE001 - reported per kernel, the others go on
            rows.append({"file": name, "ok": False, "error": f"{type(exc).__name__}: "
                                                            f"{str(exc)[-600:]}"})
        r = rows[-1]
        shared = f"  shared {r['shared'] // 1024} KB" if r.get("shared") else ""
        print(f"{name[:40]}  {'ok' if r['ok'] else 'FAILED'}"
              f"{'  v4 loads' if r.get('v4') else ''}{'  mma' if r.get('mma') else ''}"
              f"{shared}  {r.get('error', '')}", flush=True)
    print(f"triton {triton.__version__}, sm_{args.arch}: {sum(r['ok'] for r in rows)} of "
          f"{len(rows)} kernels compiled")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"triton": triton.__version__, "arch": args.arch, "kernels": rows}, f,
                      indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
