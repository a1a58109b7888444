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
coordinates float64, as tests/gpu makes them); the line per kernel says ok (and whether
its loads include 128-bit vectors) or the compiler's error. Exit status 1 if any failed.
Modules without a propagate signature (attention, kNN selection) are skipped.
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


def compile_one(text: str, symbol: str, types: dict, consts: dict, warps: int, arch: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    path = os.path.join(tempfile.mkdtemp(prefix="tiga-compile-"), f"{symbol}.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(symbol, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names = list(types)
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names)
             if types[a].startswith("*")}
    return triton.compile(ASTSource(fn=getattr(module, symbol), signature=types,
                                    constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache", help="a TIGA_CACHE_DIR")
    ap.add_argument("--arch", type=int, default=90, help="compute capability (90: H100)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "0"   # (before triton is imported: compiled kernels)
    import triton

    rows = []
    for name, symbol, text, types, consts, warps in kernels(args.cache):
        try:
            ptx = compile_one(text, symbol, types, consts, warps, args.arch).asm["ptx"]
            rows.append({"file": name, "ok": True, "v4": "ld.global.v4" in ptx})
        except Exception as exc:   # noqa: BLE001 - reported per kernel, the others go on
            rows.append({"file": name, "ok": False, "error": f"{type(exc).__name__}: "
                                                            f"{str(exc)[-600:]}"})
        r = rows[-1]
        print(f"{name[:16]}  {'ok' if r['ok'] else 'FAILED'}"
              f"{'  v4 loads' if r.get('v4') else ''}  {r.get('error', '')}", flush=True)
    print(f"triton {triton.__version__}, sm_{args.arch}: {sum(r['ok'] for r in rows)} of "
          f"{len(rows)} kernels compiled")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"triton": triton.__version__, "arch": args.arch, "kernels": rows}, f,
                      indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
