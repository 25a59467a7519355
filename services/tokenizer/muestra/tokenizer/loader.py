"""Loading tokenizer folders: tokenizer.json or a SentencePiece .model, plus the transformers config files."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from muestra.tokenizer.backend import TokenizerBackend
from muestra.tokenizer.chat import ChatTemplate
from muestra.tokenizer.hf_backend import TokenizersBackend
from muestra.tokenizer.sp_backend import SentencePieceBackend

log = logging.getLogger(__name__)

# The named special tokens transformers passes to chat templates (SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# transformers writes int(1e30) as model_max_length when a tokenizer has no limit.
_NO_LIMIT = 2**63


@dataclasses.dataclass
class LoadedTokenizer:
    """A tokenizer as the service serves it: the backend plus what the config files say about it."""

    name: str
    path: Path
    backend: TokenizerBackend
    # Named special tokens as strings ("bos_token" → "<s>"), the chat template's variables.
    special_tokens: dict[str, str]
    bos_token_id: int | None
    eos_token_ids: list[int]
    pad_token_id: int | None
    # 0 when the config gives none.
    model_max_length: int
    chat_template: ChatTemplate | None


def parse_models(spec: str) -> list[tuple[str, Path]]:
    """`name=path,path2` → [(name, path), (folder name of path2, path2)]."""
    entries = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, sep, path = item.partition("=")
        if not sep or not name or "/" in name or "\\" in name:
            name, path = Path(item).name, item
        entries.append((name.strip(), Path(path.strip()).expanduser()))
    names = [name for name, _ in entries]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"tokenizer names must be unique; repeated: {', '.join(duplicates)}")
    return entries


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        value = json.load(f)
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return value


def _token_text(value) -> str | None:
    """A special token as configs spell it: a string, or an AddedToken dict with "content"."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _special_tokens(folder: Path, config: dict) -> dict[str, str]:
    values = {name: config.get(name) for name in SPECIAL_TOKEN_NAMES}
    # As transformers does: special_tokens_map.json counts only for configs without added_tokens_decoder.
    if "added_tokens_decoder" not in config:
        for name, value in _read_json(folder / "special_tokens_map.json").items():
            if name in values:
                values[name] = value
    return {name: text for name, value in values.items() if (text := _token_text(value)) is not None}


def _chat_template_source(folder: Path, config: dict) -> str | None:
    # As transformers does: a chat_template.jinja file wins over the config's entry.
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # several named templates: serve the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


def _backend(folder: Path, config: dict) -> TokenizerBackend:
    if (folder / "tokenizer.json").is_file():
        return TokenizersBackend(folder / "tokenizer.json")
    sp_models = sorted(folder.glob("*.model"))
    if (folder / "tokenizer.model").is_file():
        sp_models = [folder / "tokenizer.model"]
    if len(sp_models) == 1:
        return SentencePieceBackend(
            sp_models[0],
            add_bos=bool(config.get("add_bos_token", True)),
            add_eos=bool(config.get("add_eos_token", False)),
        )
    if len(sp_models) > 1:
        raise ValueError(f"{folder}: several .model files ({', '.join(p.name for p in sp_models)}); keep one")
    raise ValueError(f"{folder}: no tokenizer.json and no SentencePiece .model file")


def load_tokenizer(name: str, folder: Path) -> LoadedTokenizer:
    """Load one folder; raises ValueError with the path when it is not a usable tokenizer."""
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a directory")
    config = _read_json(folder / "tokenizer_config.json")
    backend = _backend(folder, config)
    special = _special_tokens(folder, config)
    if isinstance(backend, SentencePieceBackend):
        # A bare .model names its own control pieces; the config, when it names them, wins.
        processor = backend.processor
        for key, token_id in (("bos_token", processor.bos_id()), ("eos_token", processor.eos_id()),
                              ("unk_token", processor.unk_id()), ("pad_token", processor.pad_id())):  # fmt: skip
            if token_id >= 0:
                special.setdefault(key, backend.id_to_token(token_id))

    def id_of(key: str) -> int | None:
        if key not in special:
            return None
        token_id = backend.token_to_id(special[key])
        if token_id is None:
            log.warning("%s: %s %r is not in the vocabulary", folder, key, special[key])
        return token_id

    max_length = config.get("model_max_length")
    source = _chat_template_source(folder, config)
    eos = id_of("eos_token")
    return LoadedTokenizer(
        name=name,
        path=folder,
        backend=backend,
        special_tokens=special,
        bos_token_id=id_of("bos_token"),
        eos_token_ids=[] if eos is None else [eos],
        pad_token_id=id_of("pad_token"),
        model_max_length=int(max_length) if isinstance(max_length, (int, float)) and 0 < max_length < _NO_LIMIT else 0,
        chat_template=ChatTemplate(source) if source is not None else None,
    )
