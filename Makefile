# The habits of this project. `make serve` and `make test` are the README's
# two set-up commands: each installs everything it needs into .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install serve test browser lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

serve: install
	$(VENV)/bin/yrelay serve $(ARGS)

test: install browser
	$(PY) -m pytest $(ARGS)

# Browser tests use Debian's chromium (Playwright drives it; it never downloads one).
browser:
	@command -v chromium >/dev/null || (apt-get install -y -q chromium >/dev/null 2>&1 || \
		(apt-get update -q && apt-get install -y -q chromium))

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis data
