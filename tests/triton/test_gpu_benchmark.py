"""benchmarks/gpu.py without a CUDA device: it says so and exits 0 (its --smoke run, which
checks every workload against its baseline under triton-interpreter, is too slow for here)."""
import importlib.util
import pathlib

import pytest
import torch

PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device runs the benchmark")
def test_skips_without_cuda(capsys):
    spec = importlib.util.spec_from_file_location("tiga_gpu_benchmark", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([]) == 0
    assert "skipped: no CUDA device" in capsys.readouterr().out
