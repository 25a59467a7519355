"""ListPlugins with an image backend that does not answer: the samplers, and whose schedulers are missing."""

from __future__ import annotations

import grpc

from muestra.v1 import gateway_pb2, gateway_pb2_grpc


def _list(stack) -> gateway_pb2.ListPluginsResponse:
    with grpc.insecure_channel(stack.gateway.address) as channel:
        return gateway_pb2_grpc.GatewayStub(channel).ListPlugins(gateway_pb2.ListPluginsRequest(), timeout=30)


def test_list_plugins_names_an_unanswering_diffusion_service_instead_of_failing(observed):
    answered = _list(observed)
    assert not answered.unanswered_image_models
    assert any(p.schedulers for p in answered.plugins) and any(p.samplers for p in answered.plugins)
    observed.diffusion.pause()
    try:
        degraded = _list(observed)
    finally:
        observed.diffusion.resume()
    assert list(degraded.unanswered_image_models) == ["muestra-image"]
    assert [(p.name, list(p.samplers)) for p in degraded.plugins if p.samplers] == [
        (p.name, list(p.samplers)) for p in answered.plugins if p.samplers
    ]
    assert not any(p.schedulers for p in degraded.plugins)
