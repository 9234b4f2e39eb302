.PHONY: setup demo test test-fast bench docs reliability mutate
setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/python -m funnel_core demo

test: setup
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q tests --nbmake examples

bench: setup  # every benchmark in turn (hours on 2 CPU cores); DATA=../shared/data by default (FUNNEL_DATA: not every script takes --data)
	for b in benchmarks/bench_*.py; do FUNNEL_DATA=$${DATA:-../shared/data} .venv/bin/python $$b || exit 1; done
	for c in benchmarks/configs/*.toml; do n=$$(basename $$c .toml); .venv/bin/funnel eval $$c --out benchmarks/results/$$n --cache-dir .cache/$$n || exit 1; done

test-fast: setup  # the fast tier (no model), failing any of its tests that takes over 2 s
	HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q tests -m fast --tier-check

docs: setup
	.venv/bin/mkdocs build --strict

reliability: setup  # long reliability run (~15-20 min on 2 cores): kills, bit flips, concurrency, fuzz, eval/export caches, filters
	HF_HUB_OFFLINE=1 NUMBA_THREADING_LAYER=workqueue PYTHONPATH=. .venv/bin/python tests/reliability/run.py --out benchmarks/results/reliability.json
	.venv/bin/python benchmarks/report.py

mutate: setup  # mutation testing of the paper algorithms (slow, not in CI): python scripts/mutate.py [fid rankrag ...]
	.venv/bin/python -c "import mutmut" 2>/dev/null || .venv/bin/python -m pip install -q "mutmut>=3.3"
	HF_HUB_OFFLINE=1 nice -n 10 .venv/bin/python scripts/mutate.py --max-children 2
