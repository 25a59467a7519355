"""Train the tiny text fixture's tokenizer and write it to models/tiny-text-fixture/.

    python models/train_tokenizer.py [--out models/tiny-text-fixture]

A byte-level BPE (vocab 4096, special tokens <|bos|>, <|eos|>, <|pad|>) trained on the text of
CPython's `pydoc_data/topics.py`, which ships with every Python, so no download is needed. The
training is deterministic for a given corpus; CORPUS_SHA256 is the corpus the committed files were
trained on (CPython 3.11.7), and the script says so when this Python's corpus differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pydoc_data.topics
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 4096
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
MODEL_MAX_LENGTH = 512  # the tiny text fixture's context (max_position_embeddings)
CORPUS_SHA256 = "abaa56a64551d8eead1b19cbae3c6db443f99f0cab81df07bed3cb75c0db9346"

# ChatML's shape, with <|bos|> opening a turn and <|eos|> closing it (so generation stops at EOS).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "{{- bos_token + message['role'] + '\\n' + message['content'] + eos_token + '\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- bos_token + 'assistant\\n' -}}\n"
    "{%- endif -%}\n"
)


def corpus_path() -> Path:
    return Path(pydoc_data.topics.__file__)


def corpus_texts() -> list[str]:
    """The help topics of this Python, in a fixed order."""
    topics = pydoc_data.topics.topics
    return [topics[name] for name in sorted(topics)]


def build_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_texts(), trainer=trainer)
    return tokenizer


def tokenizer_config(tokenizer: Tokenizer) -> dict:
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in (BOS, EOS, PAD)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": MODEL_MAX_LENGTH,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save(str(out / "tokenizer.json"), pretty=False)
    dump = dict(ensure_ascii=False, indent=2, sort_keys=True)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tokenizer), **dump) + "\n")
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    (out / "special_tokens_map.json").write_text(json.dumps(special, **dump) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "tiny-text-fixture")
    args = parser.parse_args(argv)
    digest = hashlib.sha256(corpus_path().read_bytes()).hexdigest()
    if digest != CORPUS_SHA256:
        print(f"note: this Python's pydoc_data/topics.py ({digest[:12]}) is not the corpus of the committed files")
    write(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
