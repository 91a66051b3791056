# The few verbs people use. Each one sets up what it needs first.
.PHONY: setup demo test lint bench clean

setup:
	bash scripts/setup.sh

demo: setup
	bash scripts/demo.sh

test: setup
	bash scripts/test.sh

lint:
	.venv/bin/ruff check .

bench: setup
	.venv/bin/python bench/overhead.py
	.venv/bin/python bench/gateway.py

clean:
	.venv/bin/ale cleanup || true

.PHONY: docs
docs: ; .venv/bin/python -m ale.isolation.rules --markdown > docs/isolation.md
