"""bench/llama_cpp.py builds llama.cpp for the machine's own ISA, but never with AMX: in the sandbox these
benches run in, a CPU that lists amx_tile kills an AMX build's llama-server at its first `ldtilecfg` (SIGSEGV,
seen on an Intel Xeon with AMX, 2026-12-08)."""

from __future__ import annotations

from bench.llama_cpp import isa_options


def test_a_cpu_without_amx_gets_the_native_build():
    assert isa_options({"avx2", "fma", "avx512f", "avx512_vnni"}) == ["-DGGML_NATIVE=ON"]


def test_a_cpu_with_amx_gets_every_extension_it_has_and_no_amx():
    flags = {"sse4_2", "f16c", "fma", "bmi2", "avx", "avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8"}
    options = isa_options(flags)
    assert "-DGGML_NATIVE=OFF" in options and "-DGGML_NATIVE=ON" not in options
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(options)
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON"} <= set(options)
    # What the CPU lacks stays off rather than being assumed.
    assert {"-DGGML_AVX512_BF16=OFF", "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX_VNNI=OFF"} <= set(options)
