# The two commands of the README: `make demo` (the product working) and `make test` (the suite).
PY := .venv/bin/python

.PHONY: demo test bootstrap docker-up lint typecheck pytest bench

bootstrap:
	@bash scripts/bootstrap.sh

demo: bootstrap
	$(PY) scripts/demo.py

test: bootstrap docker-up lint typecheck pytest

# The docker engine and the sandbox images (cached); never fails: docker tests skip instead.
docker-up: bootstrap
	@bash scripts/docker-up.sh

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck:
	$(PY) scripts/typecheck.py

pytest:
	$(PY) -m pytest -q -rs --durations=40

bench: bootstrap
	$(PY) bench/api.py
	$(PY) bench/humaneval.py
