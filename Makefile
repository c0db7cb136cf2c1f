# kvlab — every target sets itself up on a fresh machine (Python 3.11 with venv).
# The venv gets the dev and bench extras: the bench extra (libCacheSim, GPL) is a test and
# benchmark anchor only, never a kvlab runtime dependency.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench warmup lab dashboard clean redis-server chromium

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

## Debian's chromium, for the browser tests (tests/test_browser.py drives it with Playwright; its own browser download is never used)
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || [ -n "$$KVLAB_CHROMIUM" ] || { \
	  echo "installing Debian's chromium (the browser tests)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }

## make lint — ruff (rules in pyproject.toml [tool.ruff]) on the package, the tests and the benchmarks
lint: $(STAMP)
	$(BIN)/ruff check kvlab tests benchmarks

## make test — lint first, then unit, property, golden and doctest suites plus every notebook (smoke mode;
## 01 and 06 run in JupyterLab under the browser test, tests/test_browser.py, rather than twice)
test: lint $(STAMP) redis-server chromium
	KVLAB_SMOKE=1 PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/python -m pytest -q --nbmake --nbmake-timeout=300 \
		--ignore=notebooks/01_quickstart.ipynb --ignore=notebooks/06_tiers.ipynb tests kvlab notebooks

## make bench — every benchmark (benchmarks/bench_*.py) against its named anchor, then a table of every target met/missed; exit 1 if any missed or crashed. JSON in out/bench/; one or some: make bench ONLY="replay hashing"
bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py --out-dir out/bench $(foreach name,$(ONLY),--only $(name))

## make warmup — compile the kernels the notebooks and the dashboard use (once per install: minutes the first time, seconds after)
warmup: $(STAMP)
	$(BIN)/kvlab warmup

## make lab — JupyterLab on the notebooks, warmed up first (as root, how containers and workshop VMs run, with --allow-root)
lab: $(STAMP) warmup
	$(BIN)/jupyter lab notebooks $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

## make dashboard — the workshop dashboard on Voilà, warmed up first (replay panel, tiers, cluster; pick or upload a trace, no code cells): open the URL it prints, Ctrl-C stops it
dashboard: $(STAMP) warmup
	$(BIN)/kvlab dashboard conversation

clean:
	rm -rf $(VENV) out .hypothesis .ruff_cache
