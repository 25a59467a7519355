"""`muestra generate` sends the request a gRPC client would: --sampler chains, standard input."""

from __future__ import annotations

from google.protobuf import struct_pb2

from muestra.v1 import gateway_pb2
from tests.cli.conftest import muestra

PROMPT = "Once upon a time"


def grpc_text(stack, samplers: list[tuple[str, dict]], seed: int, max_tokens: int = 24) -> str:
    request = gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=max_tokens, seed=seed, ignore_eos=True)
    for name, params in samplers:
        struct = struct_pb2.Struct()
        struct.update(params)
        request.samplers.append(gateway_pb2.SamplerSpec(name=name, params=struct))
    return "".join(m.delta.text for m in stack.stub.Generate(request, timeout=60) if m.HasField("delta"))


def cli_text(stack, *args: str, prompt: str = PROMPT, **kwargs) -> str:
    result = muestra(
        "generate", prompt, "--max-tokens", "24", "--ignore-eos", "--gateway", stack.gateway.address, *args, **kwargs
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("\n")
    return result.stdout[:-1]


def test_sampler_chain_with_a_plugin_equals_the_same_grpc_request(text_stack):
    stack = text_stack("llama")
    chain = [("temperature", {"temperature": 1.3}), ("mirostat", {"tau": 3.0, "eta": 0.2})]
    cli = cli_text(
        stack, "--sampler", "temperature", "temperature=1.3", "--sampler", "mirostat", "tau=3", "eta=0.2",
        "--seed", "11",
    )  # fmt: skip
    assert cli == grpc_text(stack, chain, seed=11)
    # The chain is what made the text: the same seed with another tau, or greedy, gives other text.
    assert cli != grpc_text(stack, [("temperature", {"temperature": 1.3}), ("mirostat", {"tau": 9.0})], seed=11)
    assert cli != grpc_text(stack, [("greedy", {})], seed=11)


def test_sampler_values_are_json(text_stack):
    stack = text_stack("llama")
    # logit_bias takes an object: ban the greedy first token, and the text changes as over gRPC.
    greedy_ids = [
        m.delta.token_ids[0]
        for m in stack.stub.Generate(
            gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=1, samplers=[gateway_pb2.SamplerSpec(name="greedy")]),
            timeout=60,
        )
        if m.HasField("delta") and m.delta.token_ids
    ]
    bias = {"logit_bias": {str(greedy_ids[0]): -100}}
    cli = cli_text(stack, "--sampler", "logit_bias", f'logit_bias={{"{greedy_ids[0]}": -100}}', "--sampler", "greedy")
    assert cli == grpc_text(stack, [("logit_bias", bias), ("greedy", {})], seed=0)
    assert cli != grpc_text(stack, [("greedy", {})], seed=0)


def test_dash_reads_the_prompt_from_standard_input(text_stack):
    stack = text_stack("llama")
    from_stdin = cli_text(stack, "--temperature", "0", prompt="-", input=PROMPT + "\n")
    assert from_stdin == cli_text(stack, "--temperature", "0")
    assert from_stdin == grpc_text(stack, [("greedy", {})], seed=0)
