# Tiga developer entry points. Needs Python >= 3.11 and PyPI (a C compiler is optional).
#   make demo   install (+ CPU torch, pinned) and run the examples, one summary line each
#               (TIGA_DEMO_VERBOSE=1: each example's full explain() report too)
#   make test   install test deps (+ CPU torch, + the gpu and dist extras) and run the suite with
#               xdist under the hypothesis "ci" profile (>= 25 examples per property); the MPI tests
#               run inside it under mpiexec with 2, 3 and 4 ranks, bounded by MPIEXEC_TIMEOUT.
#               tests/gpu runs on CUDA, else through Triton's interpreter (GPU_TESTS_ON_CPU=0: skip it)
#   make golden regenerate tests/lower/golden/*.mlir after an intended IR printer change (the
#               tests only compare; review the diff)
#   make bench  install bench deps (+ CPU torch) and run every benchmark (benchmarks/run.py),
#               regenerating benchmarks/RESULTS.md (BENCH_ARGS=--quick: a smoke run)
#   make docs   install the docs extra and build the user guide and API reference into site/
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip --disable-pip-version-check
# Exact pin: CPU build from the local wheel cache; never an open range (GBs of CUDA).
TORCH_PIN := torch==2.13.0
PYTEST_WORKERS ?= 2
PYTEST_ARGS ?=
# tests/gpu without CUDA: auto (and 1) runs its 59 CUDA-route tests through Triton's interpreter,
# with xdist (about 9 CPU-minutes), so a broken Triton rule fails on a CPU machine too; 0 lets
# them skip, saying "no CUDA device"
GPU_TESTS_ON_CPU ?= auto
# ci: every hypothesis property runs >= 25 examples (tests/conftest.py); dev: as each one's @settings
HYPOTHESIS_PROFILE ?= ci
# Examples run by `make demo`, in order; missing ones are skipped.
DEMO_EXAMPLES := examples/weighted_sum.py examples/edge_nn.py examples/causal_attention.py \
	examples/gnn_layers.py examples/node_classification.py examples/dgcnn_edgeconv.py \
	examples/pagerank.py examples/shortest_paths.py examples/connected_components.py

# Stamps live inside the venv (so deleting it resets them) and are keyed on
# pyproject.toml: a re-run only reinstalls when the dependencies changed.
INSTALL_STAMP := $(VENV)/.tiga-install.stamp
TEST_STAMP := $(VENV)/.tiga-test.stamp
LINT_STAMP := $(VENV)/.tiga-lint.stamp
DEMO_STAMP := $(VENV)/.tiga-demo.stamp
BENCH_STAMP := $(VENV)/.tiga-bench.stamp
DOCS_STAMP := $(VENV)/.tiga-docs.stamp
BENCH_ARGS ?=

.PHONY: .venv install demo test golden bench docs lint clean distclean

.venv: $(VPY)

# (-qq: warnings about this machine's pip configuration are not the demo's output; errors show)
$(VPY):
	@echo "creating $(VENV) ..."
	@$(PY) -m venv $(VENV)
	@$(PIP) install -qq --upgrade pip

$(INSTALL_STAMP): pyproject.toml | $(VPY)
	@$(PIP) install -qq -e .
	@touch $@

# The dist extra (mpi4py + the mpich wheel) lets tests/distributed/test_launch.py run the
# MPI tests under mpiexec with 2, 3 and 4 ranks; the gpu extra (triton) runs every Triton kernel in
# Triton's interpreter. Both are required: an install that fails stops `make test`, and the test
# target checks that they import (EXTRAS_CHECK) before it runs anything. torch_geometric (the
# PyG oracle of the GNN-layer tests, beside their dense-torch oracle) and the docs extra (the
# mkdocs build test) are optional: where one cannot install, its tests are reported skips.
$(TEST_STAMP): pyproject.toml | $(VPY)
	$(PIP) install -q -e ".[test]"
	$(PIP) install -q "$(TORCH_PIN)"
	$(PIP) install -q -e ".[gpu]"
	$(PIP) install -q -e ".[dist]"
	$(PIP) install -q "torch_geometric==2.8.1" || echo "torch_geometric not installable: PyG comparisons are reported skips"
	$(PIP) install -q -e ".[docs]" || echo "docs extra not installable: the mkdocs build test is a reported skip"
	@touch $@ $(INSTALL_STAMP)

# What the gpu and dist extras must give (the tests that need them skip without it).
EXTRAS_CHECK := import pathlib, shutil, sys, torch, triton, triton.language, mpi4py; \
	assert (pathlib.Path(sys.executable).parent / "mpiexec").exists() or shutil.which("mpiexec"), \
	"the dist extra installed no mpiexec"

# PyG and faiss are optional peers: installed when PyPI has a build for this Python and
# platform, skipped otherwise (the benchmark then reports them as skipped).
$(BENCH_STAMP): pyproject.toml | $(VPY)
	$(PIP) install -q -e ".[bench,torch]"
	$(PIP) install -q "torch_geometric==2.8.1" || echo "torch_geometric not installable: PyG peer skipped"
	$(PIP) install -q "faiss-cpu==1.15.1" || echo "faiss-cpu not installable: faiss peer skipped"
	@touch $@ $(INSTALL_STAMP)

# The EdgeNN and attention examples check Tiga against their explicit torch references, the
# algorithm examples against scipy and networkx.
$(DEMO_STAMP): pyproject.toml | $(VPY)
	@echo "installing Tiga, torch (CPU), scipy and networkx into $(VENV) ..."
	@$(PIP) install -qq -e ".[torch]" scipy networkx
	@touch $@ $(INSTALL_STAMP)

$(DOCS_STAMP): pyproject.toml | $(VPY)
	$(PIP) install -q -e ".[docs]"
	@touch $@ $(INSTALL_STAMP)

$(LINT_STAMP): pyproject.toml | $(VPY)
	$(PIP) install -q ruff
	@touch $@

install: $(INSTALL_STAMP)

# Each example checks itself against an independent oracle and prints one summary line
# naming what it compared against (and what it skipped, and why); then a count.
demo: $(DEMO_STAMP)
	@ran=0; total=$(words $(DEMO_EXAMPLES)); for ex in $(DEMO_EXAMPLES); do \
		if [ -f "$$ex" ]; then \
			$(VPY) "$$ex" || { echo "$$ex FAILED"; echo "$$ran of $$total examples ran"; exit 1; }; \
			ran=$$((ran + 1)); \
		else \
			echo "$$ex: skipped (file not present)"; \
		fi; \
	done; echo "$$ran of $$total examples ran"

# Strict: a broken link or an unresolved API reference fails the build.
docs: $(DOCS_STAMP)
	$(VPY) -m mkdocs build --strict

# tests/gpu compiles Triton kernels for a CUDA device, so it runs in a process of its own: the
# rest of the suite imports triton for its interpreter. Without CUDA it runs through the
# interpreter (GPU_TESTS_ON_CPU=auto, tests/gpu/gpu_env.py); GPU_TESTS_ON_CPU=0 skips it.
test: $(TEST_STAMP)
	@$(VPY) -c '$(EXTRAS_CHECK)' || { echo "make test: the gpu or dist extra is installed but unusable (above); rm $(TEST_STAMP) to reinstall"; exit 1; }
	$(VPY) -m pytest -n $(PYTEST_WORKERS) -q --tb=short --hypothesis-profile=$(HYPOTHESIS_PROFILE) --ignore=tests/gpu $(PYTEST_ARGS)
	TIGA_GPU_TESTS_ON_CPU=$(GPU_TESTS_ON_CPU) $(VPY) -m pytest -q --tb=short -r s --hypothesis-profile=$(HYPOTHESIS_PROFILE) \
		$(if $(filter 0,$(GPU_TESTS_ON_CPU)),,-n $(PYTEST_WORKERS)) tests/gpu

golden: $(TEST_STAMP)
	$(VPY) tests/lower/update_golden.py --update

bench: $(BENCH_STAMP)
	$(VPY) benchmarks/run.py $(BENCH_ARGS)

lint: $(LINT_STAMP)
	$(VPY) -m ruff check tiga tests examples benchmarks

clean:
	rm -rf build dist site *.egg-info .pytest_cache .ruff_cache .hypothesis
	rm -f $(INSTALL_STAMP) $(TEST_STAMP) $(LINT_STAMP) $(BENCH_STAMP) $(DEMO_STAMP) $(DOCS_STAMP)
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
