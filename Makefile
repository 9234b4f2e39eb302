.PHONY: setup demo test bench docs notebooks
setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/python -m funnel_core demo

test: setup
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q tests --nbmake examples

bench: setup
	.venv/bin/python benchmarks/run_all.py

docs: setup
	.venv/bin/mkdocs build --strict
