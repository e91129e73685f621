# Developer shortcuts (CI runs .ci/run, which runs the README's test command).
.PHONY: test unit lint bench bench-quick

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
