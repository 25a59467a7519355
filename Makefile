PY ?= .venv/bin/python

.PHONY: dev proto proto-check lint test bench up

dev:            ## create .venv and install every distribution for development
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -r requirements-dev.txt

proto:          ## regenerate the Python stubs from proto/
	$(PY) scripts/gen_proto.py

proto-check:    ## fail if the committed stubs are stale
	$(PY) scripts/gen_proto.py --check

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test:           ## the test suite (needs redis-server on PATH)
	$(PY) -m pytest

up:             ## every service as a local process on loopback
	.venv/bin/muestra up
