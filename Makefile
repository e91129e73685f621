# Developer shortcuts (CI runs .ci/run, which runs the README's test command).
.PHONY: demo test unit lint bench bench-quick examples

# From a fresh clone: set up (venv, torch, the project) and trace + diagnose the bundled sample.
demo:
	python3 quickstart.py demo

test:
	python -m pytest

unit:
	python -m pytest -m "not integration"

lint:
	ruff check ddpdoctor tests

bench:
	python benchmarks/run.py

bench-quick:
	python benchmarks/run.py --quick

# Rewrite README.md's marked example outputs with real output of this version (one traced 2-rank run, ~1 minute).
examples:
	python docs/regen_examples.py
