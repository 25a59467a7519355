"""Configuration comes from flags, then MUESTRA_<SERVICE>_<FIELD>, then MUESTRA_<FIELD>, then defaults."""

import dataclasses

import pytest

from muestra.runtime import ServiceConfig, load_config


@dataclasses.dataclass
class ExampleConfig(ServiceConfig):
    model: str = dataclasses.field(default="default-model", metadata={"help": "model folder"})
    max_rows: int = dataclasses.field(default=8, metadata={"help": "rows"})
    use_cuda: bool = dataclasses.field(default=False, metadata={"help": "cuda"})


def test_defaults_apply_without_flags_or_env():
    config = load_config(ExampleConfig, "example", [], env={})
    assert (config.model, config.max_rows, config.use_cuda, config.host) == ("default-model", 8, False, "127.0.0.1")


def test_service_env_beats_generic_env_and_flag_beats_both():
    env = {"MUESTRA_MAX_ROWS": "2", "MUESTRA_EXAMPLE_MAX_ROWS": "3", "MUESTRA_USE_CUDA": "yes"}
    assert load_config(ExampleConfig, "example", [], env=env).max_rows == 3
    assert load_config(ExampleConfig, "example", [], env=env).use_cuda is True
    assert load_config(ExampleConfig, "example", ["--max-rows", "5"], env=env).max_rows == 5


def test_bad_env_value_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        load_config(ExampleConfig, "example", [], env={"MUESTRA_EXAMPLE_MAX_ROWS": "many"})
    assert "MUESTRA_EXAMPLE_MAX_ROWS" in capsys.readouterr().err
