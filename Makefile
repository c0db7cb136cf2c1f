# kvlab — every target sets itself up on a fresh machine (Python 3.11 with venv).
# The venv gets the dev and bench extras: the bench extra (libCacheSim, GPL) is a test and
# benchmark anchor only, never a kvlab runtime dependency.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench lab clean redis-server

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,bench]"
	touch $(STAMP)

## make demo — replay the bundled Mooncake traces; table on stdout, figures in out/demo/
demo: $(STAMP)
	$(BIN)/kvlab demo --out out/demo

## Debian's redis-server, for the Redis index tests and doctests (each starts its own server on a free port)
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { echo "installing Debian's redis-server (kvlab.index's Redis tests)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server; }

## make lint — ruff (rules in pyproject.toml [tool.ruff]) on the package, the tests and the benchmarks
lint: $(STAMP)
	$(BIN)/ruff check kvlab tests benchmarks

## make test — lint first, then unit, property, golden and doctest suites plus every notebook (smoke mode)
test: lint $(STAMP) redis-server
	KVLAB_SMOKE=1 $(BIN)/python -m pytest -q --nbmake --nbmake-timeout=300 tests kvlab notebooks

## make bench — speed measured against the named anchors; JSON in out/bench/ (recorded runs: benchmarks/results/)
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_replay.py --out out/bench/bench_replay.json
	$(BIN)/python benchmarks/bench_hashing.py --out out/bench/bench_hashing.json
	$(BIN)/python benchmarks/bench_blockpool.py --out out/bench/bench_blockpool.json
	$(BIN)/python benchmarks/bench_policies.py --out out/bench/bench_policies.json
	$(BIN)/python benchmarks/bench_mrc.py --out out/bench/bench_mrc.json
	$(BIN)/python benchmarks/bench_memory.py --out out/bench/bench_memory.json
	$(BIN)/python benchmarks/bench_explorer.py --out out/bench/bench_explorer.json
	$(BIN)/python benchmarks/bench_index.py --out out/bench/bench_index.json
	$(BIN)/python benchmarks/bench_blend.py --out out/bench/bench_blend.json
	$(BIN)/python benchmarks/bench_tiers.py --out out/bench/bench_tiers.json
	$(BIN)/python benchmarks/bench_import.py --out out/bench/bench_import.json
	$(BIN)/python benchmarks/bench_warm_start.py --out out/bench/bench_warm_start.json
	$(BIN)/python benchmarks/bench_cluster.py --out out/bench/bench_cluster.json
	$(BIN)/python benchmarks/bench_sweep_dask.py --out out/bench/bench_sweep_dask.json

## make lab — JupyterLab on the notebooks (as root, how containers and workshop VMs run, with --allow-root)
lab: $(STAMP)
	$(BIN)/jupyter lab notebooks $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

clean:
	rm -rf $(VENV) out .hypothesis .ruff_cache
