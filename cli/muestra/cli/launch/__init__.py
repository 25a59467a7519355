"""The one way to start muestra as local processes: `muestra up`, the tests' fixtures and the benches use it.

process.py: free ports, the gRPC health check, a process started until it serves (and restarted on its port),
a muestra service on a free loopback port. redis_server.py: a throwaway redis-server. stack.py: a whole stack.
"""

from muestra.cli.launch.process import Process, ServiceProcess, StartFailed, free_port, healthy, service_command
from muestra.cli.launch.redis_server import RedisServer
from muestra.cli.launch.stack import LocalStack

__all__ = [
    "LocalStack",
    "Process",
    "RedisServer",
    "ServiceProcess",
    "StartFailed",
    "free_port",
    "healthy",
    "service_command",
]
