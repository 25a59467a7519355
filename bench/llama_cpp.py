"""llama.cpp as bench/decode.py's bar, on the same weights: built from the source vendored in the
llama-cpp-python sdist, the bench's transformers folder converted with llama.cpp's own converter,
quantized with llama-quantize, timed with llama-bench and llama-batched-bench. For a GGUF file given
as it is (bench/decode.py --gguf, bench/text_quality.py --gguf): llama-quantize makes its other
types, llama-tokenize gives the ids llama-perplexity scores, llama-perplexity scores them. server_binary()
builds llama-server too, for bench/conversations.py (no web UI: nothing but the sdist is downloaded).

    .venv/bin/python -m bench.llama_cpp --model llama-100m     # build (minutes, cached), convert, time
    .venv/bin/python -c "from bench.llama_cpp import server_binary; print(server_binary())"

Nothing here runs in CI (the build compiles for minutes); tests/bench/test_llama_cpp_parsing.py
checks the parsing of the tools' output on captured samples. The build is cached under
~/.cache/muestra/llama.cpp (MUESTRA_LLAMA_CPP_CACHE), the GGUF files beside the bench's models.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("MUESTRA_LLAMA_CPP_CACHE", Path.home() / ".cache" / "muestra" / "llama.cpp"))
# The sdist whose vendor/llama.cpp is built; pinned so that a figure names the llama.cpp it measured.
SDIST = "llama-cpp-python==0.3.36"
TOOLS = ("llama-bench", "llama-quantize", "llama-batched-bench", "llama-perplexity", "llama-tokenize")
SERVER = "llama-server"
QUANTS = ("Q8_0", "Q4_0")


def source_dir() -> Path:
    """vendor/llama.cpp of the pinned sdist, downloaded from PyPI and unpacked once."""
    unpacked = CACHE / SDIST.replace("==", "-")
    source = unpacked / "llama.cpp"
    if (source / "CMakeLists.txt").is_file():
        return source
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sdist-", dir=CACHE) as scratch:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps", SDIST]
        subprocess.run([*command, "-d", scratch], check=True)
        (archive,) = Path(scratch).glob("*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(scratch, filter="data")
        (vendored,) = Path(scratch).glob("*/vendor/llama.cpp")
        unpacked.mkdir(parents=True, exist_ok=True)
        shutil.move(str(vendored), source)
    return source


# ggml's x86 ISA options and the /proc/cpuinfo flag each needs, for a build without AMX (isa_options).
ISA_FLAGS = {
    "GGML_SSE42": "sse4_2",
    "GGML_F16C": "f16c",
    "GGML_FMA": "fma",
    "GGML_BMI2": "bmi2",
    "GGML_AVX": "avx",
    "GGML_AVX2": "avx2",
    "GGML_AVX_VNNI": "avx_vnni",
    "GGML_AVX512": "avx512f",
    "GGML_AVX512_VBMI": "avx512vbmi",
    "GGML_AVX512_VNNI": "avx512_vnni",
    "GGML_AVX512_BF16": "avx512_bf16",
}


def cpu_flags() -> set[str]:
    """The first CPU's flags in /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def isa_options(flags: set[str]) -> list[str]:
    """The CPU build's ISA: the machine's own (-march=native), but on a CPU with AMX every other extension it
    has and no AMX. `-march=native` there compiles ggml's AMX kernels in, and a sandbox that hides the AMX
    tile state (gVisor's, where this bench runs) kills llama-server with SIGSEGV at its first `ldtilecfg`."""
    if not any(flag.startswith("amx") for flag in flags):
        return ["-DGGML_NATIVE=ON"]
    options = ["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    return options + [f"-D{option}={'ON' if flag in flags else 'OFF'}" for option, flag in ISA_FLAGS.items()]


def build(targets: tuple[str, ...] = TOOLS) -> Path:
    """The folder holding `targets` (CPU, isa_options), each built once per configuration."""
    source = source_dir()
    binaries = source / "build" / "bin"
    # The server is configured in (it only adds a target) so that building it later keeps TOOLS' build.
    # Its web UI stays out: the prebuilt one would be downloaded from Hugging Face, the other needs npm.
    configure = ["cmake", "-S", str(source), "-B", str(source / "build"), "-DCMAKE_BUILD_TYPE=Release"]
    configure += [*isa_options(cpu_flags()), "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF"]
    configure += ["-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"]
    # The configuration the binaries were built with: another one (another CPU, a changed ISA rule) rebuilds.
    stamp = source / "build" / "muestra-configure.json"
    same = stamp.is_file() and json.loads(stamp.read_text()) == configure[5:]
    if same and all((binaries / target).is_file() for target in targets):
        return binaries
    stamp.unlink(missing_ok=True)
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(source / "build"), "-j", jobs, "--target", *targets], check=True)
    stamp.write_text(json.dumps(configure[5:]))
    return binaries


def server_binary() -> Path:
    """llama-server (the OpenAI HTTP API over llama.cpp), built beside TOOLS if missing."""
    return build((*TOOLS, SERVER)) / SERVER


def llama_tokenizer(out: Path, vocab_size: int) -> None:
    """A Llama-2-style tokenizer.json (BPE, byte fallback, metaspace) of exactly `vocab_size` tokens.

    llama.cpp's converter reads such a tokenizer without a pre-tokenizer hash; the bench's own
    word-level tokenizer has no merges. It is trained on CPython's standard-library sources, and
    never used to encode text here: the bench feeds token ids.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials + byte_tokens, show_progress=False, limit_alphabet=200
    )
    stdlib = Path(os.__file__).parent
    files = sorted(str(p) for p in stdlib.glob("*.py"))
    tokenizer.train(files, trainer)
    missing = vocab_size - tokenizer.get_vocab_size()
    if missing > 0:  # the corpus ran out of merges: fill with plain tokens so the table matches the model
        tokenizer.add_tokens([f"<filler_{i}>" for i in range(missing)])
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tokenizer.get_vocab_size()} tokens, the model {vocab_size}")
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))


def gguf_models(name: str, hf_dir: Path, binaries: Path) -> dict[str, Path]:
    """F32, Q8_0 and Q4_0 GGUF files of the bench model in hf_dir, converted once."""
    folder = hf_dir.parent / "gguf"
    files = {"F32": folder / "model-f32.gguf", **{q: folder / f"model-{q.lower()}.gguf" for q in QUANTS}}
    if all(p.is_file() for p in files.values()):
        return files
    folder.mkdir(parents=True, exist_ok=True)
    source = binaries.parents[1]
    config = json.loads((hf_dir / "config.json").read_text())
    with tempfile.TemporaryDirectory(prefix="convert-", dir=folder) as scratch:
        staged = Path(scratch) / "hf"
        staged.mkdir()
        for item in hf_dir.iterdir():
            if item.name not in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
                (staged / item.name).symlink_to(item.resolve())
        llama_tokenizer(staged, config["vocab_size"])
        environment = {**os.environ, "PYTHONPATH": str(source / "gguf-py")}
        convert = [sys.executable, str(source / "convert_hf_to_gguf.py"), str(staged)]
        subprocess.run([*convert, "--outtype", "f32", "--outfile", str(files["F32"])], check=True, env=environment)
    for quant in QUANTS:
        subprocess.run([str(binaries / "llama-quantize"), str(files["F32"]), str(files[quant]), quant], check=True)
    return files


def parse_llama_bench(output: str) -> list[dict]:
    """llama-bench `-o json` output -> [{"test": "tg64", "depth": 0, "tokens_per_s": ..., "stddev": ...}]."""
    rows = []
    for entry in json.loads(output):
        prompt, generated = int(entry["n_prompt"]), int(entry["n_gen"])
        test = f"pp{prompt}" if prompt and not generated else f"tg{generated}"
        if prompt and generated:
            test = f"pp{prompt}+tg{generated}"
        rows.append(
            {
                "test": test,
                "depth": int(entry.get("n_depth", 0)),
                "threads": int(entry["n_threads"]),
                "type": entry.get("model_type", ""),
                "tokens_per_s": float(entry["avg_ts"]),
                "stddev": float(entry["stddev_ts"]),
                # The fastest repetition, as ours count their fastest chunk (the machines are noisy).
                "fastest_tokens_per_s": max(map(float, entry.get("samples_ts") or [entry["avg_ts"]])),
            }
        )
    return rows


_BATCHED_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|(.*)\|\s*$")


def parse_batched_bench(output: str) -> list[dict]:
    """llama-batched-bench's markdown table -> [{"pp", "tg", "batch", "tg_tokens_per_s", ...}].

    Columns: PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s.
    """
    rows = []
    for line in output.splitlines():
        match = _BATCHED_ROW.match(line.strip())
        if not match:
            continue
        pp, tg, batch, n_kv = (int(match.group(i)) for i in range(1, 5))
        cells = [c.strip() for c in match.group(5).split("|")]
        if len(cells) != 6:
            continue
        _, s_pp, _, s_tg, _, _ = (float(c) for c in cells)
        rows.append(
            {"pp": pp, "tg": tg, "batch": batch, "n_kv": n_kv, "pp_tokens_per_s": s_pp, "tg_tokens_per_s": s_tg}
        )
    return rows


_PERPLEXITY_RUN = re.compile(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)")
_PERPLEXITY_FINAL = re.compile(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)")
_PERPLEXITY_CHUNK = re.compile(r"\[(\d+)\]([\d.]+),")


def parse_perplexity(output: str) -> dict:
    """llama-perplexity's log -> {"chunks", "context", "perplexity", "error", "running": [after chunk 1, 2, ...]}."""
    run, final = _PERPLEXITY_RUN.search(output), _PERPLEXITY_FINAL.search(output)
    if run is None or final is None:
        raise ValueError(f"no perplexity in llama-perplexity's output: ...{output[-400:]!r}")
    return {
        "chunks": int(run.group(1)),
        "context": int(run.group(2)),
        "perplexity": float(final.group(1)),
        "error": float(final.group(2)),
        "running": [float(m.group(2)) for m in _PERPLEXITY_CHUNK.finditer(output)],
    }


def parse_token_ids(output: str) -> list[int]:
    """llama-tokenize --ids output: one line "[id, id, ...]" (other lines are log)."""
    lines = [line for line in output.splitlines() if line.startswith("[") and line.rstrip().endswith("]")]
    if len(lines) != 1:
        raise ValueError(f"expected one line of ids in llama-tokenize's output, found {len(lines)}")
    return json.loads(lines[0])


def tokenize(binaries: Path, model: Path, text: list[str]) -> list[int]:
    """The ids llama-perplexity evaluates for the same text: the model's BOS if its vocabulary adds one,
    special-token names left as text, no escape processing (llama-perplexity's defaults). `text` is
    ["-f", FILE] or ["-p", TEXT]; FILE must not end in a newline (llama-perplexity's -f drops one)."""
    command = [str(binaries / "llama-tokenize"), "-m", str(model), *text, "--ids", "--no-parse-special"]
    done = subprocess.run([*command, "--no-escape", "--log-disable"], check=True, capture_output=True, text=True)
    return parse_token_ids(done.stdout)


def bos_id(binaries: Path, model: Path) -> int | None:
    """The id llama-perplexity puts in place of each chunk's first token, or None if the vocabulary adds no BOS."""
    with_bos = tokenize(binaries, model, ["-p", "x"])
    without = tokenize(binaries, model, ["-p", "x", "--no-bos"])
    return with_bos[0] if len(with_bos) > len(without) else None


def perplexity(binaries: Path, model: Path, text_file: Path, context: int, chunks: int, threads: int) -> dict:
    """llama-perplexity's default run on text_file: consecutive chunks of `context` tokens from the
    text's start, each scored on its second half (parse_perplexity's dict)."""
    command = [str(binaries / "llama-perplexity"), "-m", str(model), "-f", str(text_file), "-c", str(context)]
    command += ["--chunks", str(chunks), "-t", str(threads), "--no-escape"]
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return parse_perplexity(done.stdout)


def file_type(model: Path) -> str:
    """A GGUF file's type as llama-quantize names it ("Q4_1", "F32", ...): its general.file_type."""
    import gguf

    value = gguf.GGUFReader(model).fields["general.file_type"].contents()
    return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")


def variant(model: Path, kind: str, binaries: Path) -> Path:
    """`model` as llama.cpp type `kind`: the file itself if it is of that type, else made once with
    llama-quantize --allow-requantize, which dequantizes each tensor first (F32 from a quantized file
    holds exactly its dequantized weights; Q8_0 or Q4_0 from it quantize those again)."""
    if file_type(model) == kind:
        return model
    out = CACHE / "gguf" / f"{model.stem}-{model.stat().st_size}" / f"{kind}.gguf"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".part")
        command = [str(binaries / "llama-quantize"), "--allow-requantize", str(model), str(partial), kind]
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode:
            raise RuntimeError(f"llama-quantize {model.name} {kind} failed: ...{done.stdout[-1000:]}")
        partial.rename(out)
    return out


def llama_bench(binaries: Path, model: Path, threads: int, depths: tuple[int, ...], generate: int = 64) -> list[dict]:
    """Decode tokens/s at each depth (tokens already in the KV before the timed generation)."""
    command = [str(binaries / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", "0", "-n", str(generate)]
    command += ["-d", ",".join(map(str, depths)), "-o", "json", "-r", "3"]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return parse_llama_bench(done.stdout)


def batched_bench(binaries: Path, model: Path, threads: int, batches: tuple[int, ...], prompt: int = 64) -> list[dict]:
    """Summed decode tokens/s of `batch` parallel sequences after a `prompt`-token prompt each."""
    context = max(batches) * (prompt + 64) + 64
    command = [str(binaries / "llama-batched-bench"), "-m", str(model), "-t", str(threads), "-c", str(context)]
    command += ["-npp", str(prompt), "-ntg", "32", "-npl", ",".join(map(str, batches))]
    # Its table goes through llama.cpp's log, which may write to either stream.
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return parse_batched_bench(done.stdout)


def run(
    name: str,
    threads: int,
    depths: tuple[int, ...],
    batches: tuple[int, ...],
    kinds: tuple[str, ...] = ("F32", *QUANTS),
) -> dict:
    """llama.cpp's figures for one bench model: {"F32": {"tg": {depth: tok/s}, "batched": {b: tok/s}}, ...}."""
    from bench import decode_models

    hf_dir, _ = decode_models.build(name, "fused")
    binaries = build()
    figures: dict = {"llama.cpp": SDIST, "threads": threads}
    for kind, path in gguf_models(name, hf_dir, binaries).items():
        if kind in kinds:
            figures[kind] = speeds(binaries, path, threads, depths, batches)
    return figures


def speeds(binaries: Path, model: Path, threads: int, depths: tuple[int, ...], batches: tuple[int, ...]) -> dict:
    """One GGUF file's decode figures: {"tg": {depth: tok/s}, "tg_mean": {...}, "batched": {batch: tok/s}}."""
    single = llama_bench(binaries, model, threads, depths)
    batched = batched_bench(binaries, model, threads, batches) if batches else []
    return {
        "type": single[0]["type"],
        "tg": {row["depth"]: row["fastest_tokens_per_s"] for row in single},
        "tg_mean": {row["depth"]: row["tokens_per_s"] for row in single},
        "batched": {row["batch"]: row["tg_tokens_per_s"] for row in batched},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-100m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--depths", default="0,1000")
    parser.add_argument("--batches", default="1,8")
    args = parser.parse_args()
    depths = tuple(int(d) for d in args.depths.split(","))
    batches = tuple(int(b) for b in args.batches.split(",") if b)
    print(json.dumps(run(args.model, args.threads, depths, batches), indent=2))


if __name__ == "__main__":
    main()
