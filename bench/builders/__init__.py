"""What the benches and the tests both build: random Stable Diffusion pipelines and LoRAs (diffusion_models.py),
the tiny LMs' tokenizer (lm_tokenizer.py) and seeded JSON Schemas (json_schemas.py).

Both use them from here: the benches depend on nothing under tests/."""
