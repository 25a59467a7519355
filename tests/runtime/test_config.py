"""Configuration comes from flags, then MUESTRA_<SERVICE>_<FIELD>, then MUESTRA_<FIELD>, then defaults."""

import dataclasses

import pytest

from muestra.runtime import ServiceConfig, load_config
from muestra.runtime.config import secret


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


@dataclasses.dataclass
class SecretConfig(ServiceConfig):
    api_keys: str = secret("", "keys")


def test_a_secret_comes_from_a_file_named_by_flag_or_env(tmp_path, capsys):
    path = tmp_path / "keys"
    path.write_text("sk-one,sk-two\n")
    assert load_config(SecretConfig, "example", ["--api-keys-file", str(path)], env={}).api_keys == "sk-one,sk-two"
    env = {"MUESTRA_EXAMPLE_API_KEYS_FILE": str(path)}
    assert load_config(SecretConfig, "example", [], env=env).api_keys == "sk-one,sk-two"
    assert load_config(SecretConfig, "example", [], env={"MUESTRA_API_KEYS": "sk-env"}).api_keys == "sk-env"
    env = {"MUESTRA_INTERNAL_TOKEN_FILE": str(path)}
    assert load_config(SecretConfig, "example", [], env=env).internal_token == "sk-one,sk-two"
    assert capsys.readouterr().err == ""  # none of these is on a command line


def test_a_secret_on_the_command_line_works_with_a_warning(capsys):
    assert load_config(SecretConfig, "example", ["--api-keys", "sk-x"], env={}).api_keys == "sk-x"
    err = capsys.readouterr().err
    assert "--api-keys on the command line is visible" in err and "sk-x" not in err


def test_a_missing_secret_file_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_config(SecretConfig, "example", [], env={"MUESTRA_API_KEYS_FILE": str(tmp_path / "nope")})
    assert "MUESTRA_API_KEYS_FILE: cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, env, shown",
    [
        (["--redis-url", "http://cache:6379"], {}, "http://cache:6379"),
        ([], {"MUESTRA_REDIS_URL": "cache:6379"}, "cache:6379"),
        (["--redis-url", "ftp://user:hunter2@cache:1"], {}, "cache:1"),
    ],
)
def test_a_redis_url_of_another_scheme_is_one_line_naming_the_flag_never_the_password(argv, env, shown, capsys):
    from muestra.gateway.config import GatewayConfig

    with pytest.raises(SystemExit):
        load_config(GatewayConfig, "gateway", argv, env=env)
    err = capsys.readouterr().err
    assert f"--redis-url: must be a redis://, rediss:// or unix:// URL, got '{shown}'" in err
    assert "hunter2" not in err and "Traceback" not in err
    for good in ("redis://127.0.0.1:6379/0", "rediss://:pw@cache:6380", "unix:///run/redis.sock"):
        assert load_config(GatewayConfig, "gateway", ["--responses-redis-url", good], env={}).responses_redis_url
