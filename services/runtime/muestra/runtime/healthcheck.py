"""`python -m muestra.runtime.healthcheck ADDRESS|SERVICE`: exit 0 when the gRPC health check says SERVING.

For container HEALTHCHECKs, which have no grpc_health_probe. Given a service name instead of an address,
it checks the host and port that service reads from its environment (MUESTRA_<SERVICE>_PORT, else
MUESTRA_PORT; a wildcard host such as 0.0.0.0 means loopback), so the check follows the container's settings.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def address_of(target: str, env: dict | None = None) -> str:
    """`target` itself when it is HOST:PORT, else the loopback address of the service named `target`."""
    if ":" in target:
        return target
    env = os.environ if env is None else env
    prefix = f"MUESTRA_{target.upper()}_"
    port = env.get(prefix + "PORT") or env.get("MUESTRA_PORT")
    if not port:
        raise ValueError(f"no port for {target!r}: set {prefix}PORT or pass HOST:PORT")
    host = env.get(prefix + "HOST") or env.get("MUESTRA_HOST") or "127.0.0.1"
    if host in ("0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"


def check(address: str, service: str = "", timeout_s: float = 3.0) -> str:
    """The health status name the server at `address` reports for `service` ("" = the whole server)."""
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
        )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m muestra.runtime.healthcheck", description=__doc__.split("\n")[0])
    parser.add_argument("target", help="HOST:PORT, or a service name whose MUESTRA_<SERVICE>_PORT to check")
    parser.add_argument("--service", default="", help="gRPC service name to ask about (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    args = parser.parse_args(argv)
    try:
        address = address_of(args.target)
        status = check(address, args.service, args.timeout)
    except ValueError as exc:
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 1  # Docker reserves exit code 2
    except grpc.RpcError as exc:
        print(f"healthcheck: {args.target}: {exc.code().name} {exc.details()}", file=sys.stderr)
        return 1
    if status != "SERVING":
        print(f"healthcheck: {address}: {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
