"""`python -m muestra.gateway`: the public gRPC API (and the OpenAI-compatible HTTP API) in front of the
tokenizer, lm and diffusion services."""

from __future__ import annotations

import asyncio
import logging
import time

from muestra.gateway.config import GatewayConfig
from muestra.gateway.engine.clients.backends import BackendError, ModelRegistry
from muestra.gateway.engine.engine import Engine
from muestra.gateway.engine.sampling import SamplerRegistry
from muestra.gateway.rpc.server import GatewayServicer
from muestra.runtime import ServiceSpec, load_config, run_service
from muestra.v1 import gateway_pb2, gateway_pb2_grpc

log = logging.getLogger("muestra.gateway")
# Text requests still running this long before the grace period ends are failed by the gateway.
SHUTDOWN_MARGIN_S = 1.0


def main(argv: list[str] | None = None) -> None:
    config = load_config(GatewayConfig, "gateway", argv)
    registry = ModelRegistry()
    keys = [key.strip() for key in config.api_keys.split(",") if key.strip()]

    http_servers = []
    engines: list[Engine] = []

    async def register(server) -> list[str]:
        samplers = SamplerRegistry.load()
        log.info("samplers: %s", ", ".join(samplers.names()))
        try:
            await registry.connect(config)
        except BackendError as exc:
            raise SystemExit(f"muestra-gateway: {exc}") from None
        engine = Engine(config, registry, samplers)
        engines.append(engine)
        for router in engine.routers.values():
            router.start()  # health checks from the start, not from the first request
        gateway_pb2_grpc.add_GatewayServicer_to_server(GatewayServicer(engine), server)
        if keys:
            log.info("API keys required (%d configured)", len(keys))
        if config.http_port >= 0:
            # Imported here: with the HTTP API off, the gateway does not load FastAPI at all.
            from muestra.gateway.http import start_http_api

            http_servers.append(await start_http_api(engine, config, keys))
        return [gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name]

    async def drain(grace_period_s: float) -> None:
        """Stop taking HTTP requests now; end the text requests still running just before the grace ends.

        Failed with UNAVAILABLE (and their seeds) by the gateway itself, their gRPC streams end with that
        status and their HTTP streams with an error event and [DONE], instead of being cut.
        """
        stopping = [asyncio.ensure_future(http_server.stop()) for http_server in http_servers]
        deadline = time.monotonic() + max(0.0, grace_period_s - min(SHUTDOWN_MARGIN_S, grace_period_s / 4))
        while engines and engines[0].busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if engines and engines[0].busy():
            log.warning("grace period ending: failing the text requests still running")
            engines[0].shut_down()
        await asyncio.gather(*stopping)

    async def close() -> None:
        await registry.close()

    def health_problem() -> str | None:
        return engines[0].watchdog.problem() if engines else None

    run_service(
        ServiceSpec(
            name="gateway",
            register=register,
            close=close,
            tokens=keys,
            token_name="API key",
            health_probe=health_problem,
            drain=drain,
        ),
        config,
    )


if __name__ == "__main__":
    main()
