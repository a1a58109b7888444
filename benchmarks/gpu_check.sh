#!/usr/bin/env bash
# The GPU check in one run of at most GPU_CHECK_BUDGET seconds (default 280), for a lent CUDA
# machine whose python3 already holds torch and triton (nothing is installed; tiga is read
# from this checkout): the machine's versions, the gpu-marked tests (tests/gpu: every Triton
# kernel family compiled for the device, forward and backward; the cuda-python device tier)
# within GPU_CHECK_TESTS_S seconds (default 100), then every workload of benchmarks/gpu.py
# against the best peer installed, in the time left (benchmarks/gpu_check.py: each side in a
# worker process of its own with its own limits, timed with CUDA events after warm-up; a
# peer slower than 10x Tiga is stopped and reported as such), and the paged row (a stored
# relation opened paged, its pages streamed host -> device through the device tier under the
# Triton backend: benchmarks/gpu_check_paged.py, stopped at its own limit). Into $OUT
# (default ./gpu-out):
# env.txt, tests.log, workers.log, bench.log, gpu-check.json and gpu-check.md (the table).
#     bash benchmarks/gpu_check.sh
#     GPU_CHECK_DRY=1 bash benchmarks/gpu_check.sh   # CPU: triton-interpreter, tiny sizes,
#                                                    # tests skipped (GPU_CHECK_TESTS_S=N runs
#                                                    # them on CPU too); checks the plumbing
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
PY=${PY:-python3}
DRY=${GPU_CHECK_DRY:-0}
BUDGET=${GPU_CHECK_BUDGET:-280}
if [ "$DRY" = 1 ]; then TESTS_S=${GPU_CHECK_TESTS_S:-0}; else TESTS_S=${GPU_CHECK_TESTS_S:-100}; fi
start=$SECONDS
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TIGA_CACHE_DIR=${TIGA_CACHE_DIR:-/tmp/tiga-gpu-cache}
if [ "$DRY" = 1 ]; then
    export GPU_CHECK_DRY=1 TRITON_INTERPRET=1 TIGA_GPU_TESTS_ON_CPU=1
else
    unset TRITON_INTERPRET
fi
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
    $PY - <<'EOF'
import importlib, sys
print(sys.version.split()[0])
for name in ("torch", "triton", "numpy", "llvmlite", "cuda.bindings", "hypothesis", "xdist",
             "torch_geometric", "torch_cluster", "torch_sparse", "zarr"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:
        print(name, "missing:", exc)
EOF
} 2>&1 | tee "$OUT/env.txt"
rc=0
if [ "$TESTS_S" -gt 0 ]; then
    par=""
    $PY -c "import xdist" 2>/dev/null && par="-n 8"
    timeout "$TESTS_S" $PY -m pytest -q -p no:cacheprovider --tb=short $par -r fEs \
        tests/gpu tests/xla_free_runtime/test_device_tier.py -m gpu 2>&1 | tee "$OUT/tests.log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
left=$((BUDGET - (SECONDS - start)))
# (the driver stops its own workloads at its budget; the outer timeout only guards it)
timeout $((left + 20)) $PY benchmarks/gpu_check.py --out "$OUT" --budget $((left > 15 ? left - 10 : 5)) \
    --tests-log "$OUT/tests.log" 2>&1 | tee "$OUT/bench.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
echo "gpu_check.sh: $((SECONDS - start)) s, exit $rc"
exit $rc
