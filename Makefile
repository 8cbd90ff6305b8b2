# The two commands of the README: `make demo` (the product working) and `make test` (the suite).
PY := .venv/bin/python
# Byte-compiled modules are written and reused (in __pycache__, which git, pack digests and
# image contexts ignore). A shell with PYTHONDONTWRITEBYTECODE set compiled ~300 modules
# (0.6 s of CPU) in every `palaestra serve` and CLI process the suite starts.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-fast bootstrap docker-up lint typecheck pytest bench

bootstrap:
	@bash scripts/bootstrap.sh

demo: bootstrap
	$(PY) scripts/demo.py

test: bootstrap docker-up lint typecheck pytest

# The docker engine and the sandbox images (cached); never fails: docker tests skip instead.
docker-up: bootstrap
	@bash scripts/docker-up.sh

# ruff, and the layering contracts of pyproject's [tool.importlinter] (import-linter)
lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) scripts/lint_imports.py

typecheck:
	$(PY) scripts/typecheck.py

# Three workers, a test module each at a time (module fixtures stay whole): most tests wait on
# sandboxes, servers and subprocesses; a third keeps a 2-core machine's cores busy through the
# waits (docs/reference/testing.md).
PYTEST_WORKERS ?= 3

pytest:
	$(PY) -m pytest -q -rs --durations=40 -n $(PYTEST_WORKERS) --dist loadfile

# The tier a developer runs while editing (tests/README.md): the unit and contract tests, no
# docker engine, within 5 minutes on an idle 2-core machine. `make test` stays the full gate.
test-fast: bootstrap
	$(PY) -m pytest -q -rs --durations=20 -m "not slow" -n $(PYTEST_WORKERS) --dist loadfile

bench: bootstrap
	$(PY) bench/api.py
	$(PY) bench/humaneval.py
