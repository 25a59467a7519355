"""Train the tiny text fixture's Llama from scratch on CPU and export it into models/tiny-text-fixture/.

    .venv/bin/python models/train_text_model.py [--out models/tiny-text-fixture] [--steps N]
    make models-text          # the tokenizer first (models/train_tokenizer.py), then this

A small Llama (RoPE, RMSNorm, SwiGLU, grouped-query attention) on the tokenizer already in --out,
trained on the corpus of text_corpus.py (CPython's own documentation and docstrings), then exported
with muestra.lm.export. Deterministic: fixed seeds, a seeded data order, one CPU thread by default
(the same machine, thread count and torch version give the same weights).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import text_corpus  # noqa: E402  (a sibling script, not an installed module)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# What the exporter writes next to the tokenizer files; replaced in --out, nothing else is touched.
MODEL_FILES = ("model.onnx", "model.onnx.data", "config.json", "generation_config.json", "muestra_export.json")
# The shipped precision (models/README.md): the fastest within 2% of float32's held-out perplexity whose rows
# do not depend on each other: int8 (8-bit MatMulNBits, block 32) is +0.06% and 1.35x float32's decode rate
# through the lm. int8-dynamic (+0.15%) is out: onnxruntime's dynamic quantization scales the activations of
# the whole batch at once, so a row's tokens change with its batch. int4 is +3.6% at block 32.
DEFAULT_DTYPE = "int8"
QUANTIZED = ("int8", "int4", "int8-dynamic")
# The default chain (the gateway reads it like transformers' generate()): repetition penalty, temperature, top_p,
# sample. top_k 0 turns top-k off; left out, transformers' default of 50 would add it.
GENERATION_CONFIG = {
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "do_sample": True,
    "temperature": 0.8,
    "top_k": 0,
    "top_p": 0.95,
    "repetition_penalty": 1.1,
}


@dataclass
class ModelShape:
    hidden_size: int = 256
    intermediate_size: int = 704
    num_hidden_layers: int = 4
    num_attention_heads: int = 4  # head_dim 64: CPU attention kernels are much faster than at 32
    num_key_value_heads: int = 2


@dataclass
class TrainSettings:
    steps: int = 2800
    batch_size: int = 4
    learning_rate: float = 2e-3
    min_learning_rate: float = 2e-4
    warmup_steps: int = 40
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 1
    bf16: bool = True
    optimizer: str = "muon"


def token_stream(tokenizer, documents: list[text_corpus.Document], eos_id: int) -> list[int]:
    """Every document's ids followed by <|eos|>, concatenated in corpus order."""
    ids: list[int] = []
    for encoding in tokenizer.encode_batch([doc.text for doc in documents]):
        ids.extend(encoding.ids)
        ids.append(eos_id)
    return ids


def epoch_windows(stream, seq_len: int, generator):
    """The stream cut into seq_len windows from a random offset, in a random order (one epoch)."""
    import torch

    offset = int(torch.randint(0, seq_len, (1,), generator=generator))
    count = (len(stream) - offset) // seq_len
    windows = stream[offset : offset + count * seq_len].view(count, seq_len)
    return windows[torch.randperm(count, generator=generator)]


def batches(stream, seq_len: int, batch_size: int, steps: int, generator):
    """`steps` batches of windows; epochs follow each other, a partial last batch of an epoch is dropped."""
    produced = 0
    while True:
        windows = epoch_windows(stream, seq_len, generator)
        for start in range(0, len(windows) - batch_size + 1, batch_size):
            yield windows[start : start + batch_size]
            produced += 1
            if produced == steps:
                return


def learning_rate(step: int, settings: TrainSettings) -> float:
    """Linear warm-up, then cosine decay to min_learning_rate at the last step."""
    if step < settings.warmup_steps:
        return settings.learning_rate * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return settings.min_learning_rate + (settings.learning_rate - settings.min_learning_rate) * cosine


def build_model(shape: ModelShape, vocab_size: int, context_length: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=context_length,
        bos_token_id=GENERATION_CONFIG["bos_token_id"],
        eos_token_id=GENERATION_CONFIG["eos_token_id"],
        pad_token_id=GENERATION_CONFIG["pad_token_id"],
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        attn_implementation="sdpa",
        **asdict(shape),
    )
    return LlamaForCausalLM(config)


def optimizers(model, settings: TrainSettings) -> list:
    """Muon for the blocks' weight matrices; AdamW for the (tied) embedding and the norm gains."""
    import torch

    matrices = [p for name, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in name]
    embedding = [p for name, p in model.named_parameters() if "embed_tokens" in name]
    gains = [p for p in model.parameters() if p.dim() < 2]
    adamw_groups = [
        {"params": embedding, "weight_decay": settings.weight_decay},
        {"params": gains, "weight_decay": 0.0},
    ]
    if settings.optimizer == "adamw":
        adamw_groups.append({"params": matrices, "weight_decay": settings.weight_decay})
    chosen = [torch.optim.AdamW(adamw_groups, lr=settings.learning_rate, betas=(0.9, 0.95), eps=1e-8, foreach=True)]
    if settings.optimizer == "muon":
        # "match_rms_adamw" scales Muon's orthogonalized step to AdamW's size, so one learning rate serves both.
        chosen.append(
            torch.optim.Muon(
                matrices, lr=settings.learning_rate, weight_decay=settings.weight_decay, adjust_lr_fn="match_rms_adamw"
            )
        )
    return chosen


def train(model, stream, context_length: int, settings: TrainSettings):
    """Warm-up and cosine decay, bf16 autocast; returns the mean loss of the last 20 steps."""
    import torch
    from tqdm import tqdm

    steppers = optimizers(model, settings)
    generator = torch.Generator().manual_seed(settings.seed)
    model.train()
    recent: list[float] = []
    progress = tqdm(
        batches(stream, context_length, settings.batch_size, settings.steps, generator),
        total=settings.steps,
        unit="step",
        desc="training",
    )
    started = time.monotonic()
    for step, batch in enumerate(progress):
        for optimizer in steppers:
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, settings)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        for optimizer in steppers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        recent = [*recent[-19:], loss.item()]
        tokens_per_s = (step + 1) * batch.numel() / (time.monotonic() - started)
        progress.set_postfix(loss=f"{sum(recent) / len(recent):.3f}", tok_s=f"{tokens_per_s:.0f}")
    model.eval()
    return sum(recent) / len(recent)


def held_out_loss(model, stream, context_length: int, max_windows: int = 16) -> float:
    """Mean next-token loss (nats) of the first windows of the held-out stream, in PyTorch."""
    import torch

    count = min(max_windows, len(stream) // context_length)
    windows = stream[: count * context_length].view(count, context_length)
    with torch.no_grad():
        return float(model(input_ids=windows, labels=windows).loss)


def write_source_folder(model, tokenizer_dir: Path, folder: Path) -> None:
    """A transformers folder (weights, configs, tokenizer) for the exporter."""
    model.save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2, sort_keys=True) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, folder / name)


def export_into(src: Path, out: Path, dtype: str) -> None:
    """Export the transformers folder `src` and put the model files next to the tokenizer in `out`."""
    from muestra.lm.export import export_lm

    with tempfile.TemporaryDirectory() as tmp:
        exported = Path(tmp) / "onnx"
        quantized = dtype in QUANTIZED
        export_lm(src, exported, dtype="float32" if quantized else dtype, quantize=dtype if quantized else None)
        for name in MODEL_FILES:
            (out / name).unlink(missing_ok=True)
            if (exported / name).is_file():
                shutil.copy(exported / name, out / name)


def train_from_scratch(tokenizer_dir: Path, settings: TrainSettings, checkpoint: Path) -> None:
    """Train on the corpus's training split and save the transformers folder to `checkpoint`."""
    import torch
    from tokenizers import Tokenizer

    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    torch.use_deterministic_algorithms(True)
    context_length = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())["model_max_length"]
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eos_id = tokenizer.token_to_id("<|eos|>")
    assert eos_id == GENERATION_CONFIG["eos_token_id"], "the tokenizer's special ids moved"

    started = time.monotonic()
    documents = text_corpus.documents()
    train_docs, held_out_docs = text_corpus.split(documents)
    if sys.version.split()[0] != text_corpus.CORPUS_PYTHON:
        print(f"note: Python {sys.version.split()[0]}; the committed model was trained on {text_corpus.CORPUS_PYTHON}")
    train_ids = torch.tensor(token_stream(tokenizer, train_docs, eos_id), dtype=torch.long)
    held_out_ids = torch.tensor(token_stream(tokenizer, held_out_docs, eos_id), dtype=torch.long)
    print(
        f"corpus {text_corpus.corpus_sha256(documents)[:12]}: "
        f"train {len(train_docs)} documents, {len(train_ids):,} tokens; "
        f"held out {len(held_out_docs)} documents, {len(held_out_ids):,} tokens "
        f"({time.monotonic() - started:.0f} s)"
    )

    model = build_model(ModelShape(), tokenizer.get_vocab_size(), context_length)
    parameters = sum(p.numel() for p in model.parameters())
    tokens = settings.steps * settings.batch_size * context_length
    print(
        f"model: {parameters / 1e6:.2f}M parameters; {tokens:,} training tokens ({tokens / len(train_ids):.1f} epochs)"
    )
    wall, cpu = time.monotonic(), time.process_time()
    final_loss = train(model, train_ids, context_length, settings)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    loss = held_out_loss(model, held_out_ids, context_length)
    print(
        f"trained in {wall / 60:.1f} min ({cpu / 60:.1f} min of CPU): train loss {final_loss:.3f}, "
        f"held-out perplexity in PyTorch ~{math.exp(loss):.1f} (first windows)"
    )
    write_source_folder(model.float(), tokenizer_dir, checkpoint)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "tiny-text-fixture", help="folder holding the tokenizer")
    parser.add_argument("--steps", type=int, default=TrainSettings.steps)
    parser.add_argument("--batch-size", type=int, default=TrainSettings.batch_size)
    parser.add_argument("--learning-rate", type=float, default=TrainSettings.learning_rate, help="peak rate")
    parser.add_argument("--optimizer", choices=["muon", "adamw"], default=TrainSettings.optimizer)
    parser.add_argument("--threads", type=int, default=TrainSettings.threads, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=TrainSettings.seed)
    parser.add_argument(
        "--dtype", choices=["float32", "float16", *QUANTIZED], default=DEFAULT_DTYPE, help="exported weights"
    )
    parser.add_argument("--keep-checkpoint", type=Path, help="also save the trained transformers folder here")
    parser.add_argument("--export-from", type=Path, help="skip training: export this kept checkpoint into --out")
    args = parser.parse_args(argv)

    started = time.monotonic()
    settings = TrainSettings(
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        min_learning_rate=args.learning_rate / 10,
        seed=args.seed,
        threads=args.threads,
        optimizer=args.optimizer,
    )
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.export_from or Path(tmp) / "hf"
        if not args.export_from:
            train_from_scratch(args.out, settings, checkpoint)
            if args.keep_checkpoint:
                shutil.copytree(checkpoint, args.keep_checkpoint, dirs_exist_ok=True)
        export_into(checkpoint, args.out, args.dtype)
    size = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    print(f"wrote {args.out} ({size / 1e6:.1f} MB) in {(time.monotonic() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
