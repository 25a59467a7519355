"""The tiny random LMs' tokenizer: a byte-level BPE trained on a small fixed corpus, loadable by AutoTokenizer."""

from __future__ import annotations

from pathlib import Path

VOCAB_SIZE = 1024
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a land far away, there lived a small robot who loved to count numbers.",
    "muestra serves text and images: tokens stream as soon as they are valid UTF-8.",
    "Caf\u00e9, na\u00efve, r\u00e9sum\u00e9 \u2014 accents and dashes; emoji \U0001f600.",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u4e2d\u6587 \u0440\u0443\u0441\u0441\u043a\u0438\u0439",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 100 1000 3.14159",
    "In the beginning the model was random, and its outputs were noise; but the noise was deterministic.",
]


def save_tiny_tokenizer(out: Path) -> None:
    """Train a byte-level BPE on a small fixed corpus and save it loadable by AutoTokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token=PAD_TOKEN
    )
    fast.save_pretrained(out)
