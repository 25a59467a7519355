"""A CLIP-layout tokenizer (vocab.json + merges.txt) whose BPE merges are learnt from the training captions."""

from __future__ import annotations

import json
from pathlib import Path

# A few words beyond the captions, so that common prompt words are whole tokens too.
EXTRA_WORDS = "a an the of photo image picture drawing black white ink paper written by hand digit number de la"


def train_clip_tokenizer(captions: list[str], folder: Path, vocab_size: int = 1000, model_max_length: int = 77):
    """Write vocab.json + merges.txt (and the tokenizer config) into `folder`; return the CLIPTokenizer."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import CLIPTokenizer

    bpe = Tokenizer(models.BPE(unk_token="<|endoftext|>", end_of_word_suffix="</w>"))
    bpe.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, end_of_word_suffix="</w>", show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    bpe.train_from_iterator([*captions, EXTRA_WORDS, EXTRA_WORDS], trainer)
    merges = [" ".join(pair) for pair in json.loads(bpe.to_str())["model"]["merges"]]
    # CLIP's vocabulary order: every byte symbol, the same with "</w>", the merges, then the two specials.
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = [*alphabet, *(symbol + "</w>" for symbol in alphabet)]
    tokens += [merge.replace(" ", "") for merge in merges]
    tokens = [*dict.fromkeys(tokens), "<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(tokens)}, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    tokenizer = CLIPTokenizer(
        vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"), model_max_length=model_max_length
    )
    tokenizer.save_pretrained(folder)
    return tokenizer
