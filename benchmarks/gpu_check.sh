#!/usr/bin/env bash
# The GPU checks in one run, for a lent CUDA machine whose python3 already holds torch and
# triton (nothing is installed; tiga is read from this checkout): the machine's versions, the
# gpu-marked tests (tests/gpu: every Triton kernel family compiled for the device, forward and
# backward; the cuda-python device tier), then benchmarks/gpu.py. Logs and the benchmark's JSON
# go to $OUT (default ./gpu-out).
#     bash benchmarks/gpu_check.sh [test seconds] [seconds per benchmark workload]
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TIGA_CACHE_DIR=${TIGA_CACHE_DIR:-/tmp/tiga-gpu-cache}
unset TRITON_INTERPRET
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    $PY - <<'EOF'
import importlib, sys
print(sys.version.split()[0])
for name in ("torch", "triton", "numpy", "llvmlite", "cuda.bindings", "hypothesis",
             "torch_geometric", "torch_cluster", "zarr"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:
        print(name, "missing:", exc)
EOF
} 2>&1 | tee "$OUT/env.txt"
rc=0
timeout "${1:-300}" $PY -m pytest -q -p no:cacheprovider --tb=short -n 8 -r fEs \
    tests/gpu tests/xla_free_runtime/test_device_tier.py -m gpu 2>&1 | tee "$OUT/tests.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
# each workload in a process of its own, with its own limit, so that one that stalls costs
# only its own figures; Python's stacks are printed every 40 s to show where a stall sits
for w in csr attention edgenn knn radius; do
    timeout "${2:-60}" $PY -c "import faulthandler, runpy, sys
faulthandler.dump_traceback_later(40, repeat=True)
sys.argv = ['gpu.py', '--only', '$w', '--repeat', '10', '--json', '$OUT/gpu-$w.json']
sys.argv += ['--profile'] if '$w' == 'csr' else []
runpy.run_path('benchmarks/gpu.py', run_name='__main__')" 2>&1 | tee -a "$OUT/bench.log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
done
exit $rc
