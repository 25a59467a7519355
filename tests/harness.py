"""The names the tests have always taken from here; they live in muestra.cli.launch, which `muestra up` and the
benches use too."""

from muestra.cli.launch import RedisServer, ServiceProcess, free_port

__all__ = ["RedisServer", "ServiceProcess", "free_port"]
