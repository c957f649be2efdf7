# The README's two commands.
.PHONY: setup demo test

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/python -m ula demo

test: setup
	.venv/bin/python -m pytest -q -n auto --maxprocesses 4 tests
