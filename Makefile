# Tiga developer entry points. Needs Python >= 3.11 and PyPI (a C compiler is optional).
#   make demo   install (+ CPU torch, pinned) and run the examples, one summary line each
#               (TIGA_DEMO_VERBOSE=1: each example's full explain() report too)
#   make test   install test deps (+ CPU torch, + the dist extra) and run the suite with xdist
#               (the MPI tests run inside it under mpiexec with 2, 3 and 4 ranks, bounded by MPIEXEC_TIMEOUT)
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

.PHONY: .venv install demo test bench docs lint clean distclean

.venv: $(VPY)

$(VPY):
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(INSTALL_STAMP): pyproject.toml | $(VPY)
	$(PIP) install -q -e .
	@touch $@

# The dist extra (mpi4py + the mpich wheel) lets tests/distributed/test_launch.py run the
# MPI tests under mpiexec with 2, 3 and 4 ranks; the gpu extra (triton) runs every Triton kernel in
# Triton's interpreter; torch_geometric is the PyG oracle of the GNN-layer tests; the docs
# extra lets tests/docs build the site. Where one cannot install, its tests skip (and say why).
$(TEST_STAMP): pyproject.toml | $(VPY)
	$(PIP) install -q -e ".[test]"
	$(PIP) install -q "$(TORCH_PIN)"
	$(PIP) install -q -e ".[gpu]" || echo "gpu extra not installable: Triton tests skipped"
	$(PIP) install -q -e ".[dist]" || echo "dist extra not installable: MPI tests skipped"
	$(PIP) install -q "torch_geometric==2.8.1" || echo "torch_geometric not installable: PyG comparisons skipped"
	$(PIP) install -q -e ".[docs]" || echo "docs extra not installable: the mkdocs build test skipped"
	@touch $@ $(INSTALL_STAMP)

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
	@$(PIP) install -q -e ".[torch]" scipy networkx
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
# rest of the suite imports triton for its interpreter (without CUDA it skips, saying why).
test: $(TEST_STAMP)
	$(VPY) -m pytest -n $(PYTEST_WORKERS) -q --tb=short --ignore=tests/gpu $(PYTEST_ARGS)
	$(VPY) -m pytest -q --tb=short -r s tests/gpu

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
