"""LoRA adapters: a folder of safetensors files, A1111's prompt syntax, and the adapters loaded into the pipeline.

Loading and weighting go through diffusers' load_lora_weights / set_adapters (peft underneath); nothing is
merged into the base weights, so disabling the adapters gives the base model's outputs exactly.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

from muestra.runtime.errors import FailedPrecondition

log = logging.getLogger("muestra.diffusion.loras")

# A1111's extra-network syntax: <lora:name> or <lora:name:weight>.
PROMPT_LORA = re.compile(r"<lora:([^:<>]*)(?::([^<>]*))?>")


@dataclasses.dataclass(frozen=True)
class LoraFile:
    name: str
    path: Path
    size_bytes: int
    # Changes when the file is replaced, so a new file under an old name is loaded again.
    mtime_ns: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (str(self.path), self.mtime_ns, self.size_bytes)


class LoraFolder:
    """The *.safetensors files of --lora-dir (read again on every listing, so new files appear)."""

    def __init__(self, folder: str | Path | None) -> None:
        self.folder = Path(folder) if folder else None

    def files(self) -> dict[str, LoraFile]:
        if self.folder is None:
            return {}
        found = {}
        for path in sorted(self.folder.glob("*.safetensors")):
            stat = path.stat()
            found[path.stem] = LoraFile(path.stem, path, stat.st_size, stat.st_mtime_ns)
        return found


def split_prompt_loras(prompt: str) -> tuple[str, list[tuple[str, str]]]:
    """The prompt without its <lora:name:weight> tags, and the (name, weight text) of each tag."""
    tags = [(m.group(1).strip(), (m.group(2) or "").strip()) for m in PROMPT_LORA.finditer(prompt)]
    if not tags:
        return prompt, []
    stripped = PROMPT_LORA.sub("", prompt)
    return re.sub(r"\s{2,}", " ", stripped).strip(), tags


def prompt_with_loras(prompt: str, loras: list[tuple[LoraFile, float]]) -> str:
    """The prompt as A1111 writes it into a PNG: the tags appended, so pasting it back applies them again."""
    tags = "".join(f"<lora:{lora.name}:{weight:g}>" for lora, weight in loras)
    return f"{prompt} {tags}".strip() if tags else prompt


class LoadedAdapters:
    """The adapters loaded into a pipeline's UNet and text encoders; the least recently used beyond `capacity`
    are deleted. Not thread-safe: the engine's one worker thread calls it."""

    def __init__(self, pipe: Any, capacity: int) -> None:
        self.pipe = pipe
        self.capacity = capacity
        # LoraFile.key -> peft adapter name, least recently used first.
        self._loaded: collections.OrderedDict[tuple, str] = collections.OrderedDict()
        self._count = 0
        self.loads = 0

    @property
    def loaded(self) -> int:
        return len(self._loaded)

    def apply(self, loras: list[tuple[LoraFile, float]]) -> None:
        """Make exactly `loras` active, at their weights; none disables every adapter."""
        if not loras:
            if self._loaded:
                self.pipe.disable_lora()
            return
        wanted = {lora.key for lora, _ in loras}
        for lora, _ in loras:
            self._load(lora, keep=wanted)
        self.pipe.enable_lora()
        self.pipe.set_adapters([self._loaded[lora.key] for lora, _ in loras], [weight for _, weight in loras])

    def _load(self, lora: LoraFile, keep: set) -> None:
        if lora.key in self._loaded:
            self._loaded.move_to_end(lora.key)
            return
        while len(self._loaded) >= self.capacity:
            old = next(key for key in self._loaded if key not in keep)
            self.pipe.delete_adapters(self._loaded.pop(old))
        self._count += 1
        adapter = f"lora_{self._count}"
        try:
            self.pipe.load_lora_weights(str(lora.path), adapter_name=adapter)
        except Exception as exc:  # a corrupt file, or one for another architecture
            if adapter in self._adapter_names():
                self.pipe.delete_adapters(adapter)
            raise FailedPrecondition(f"LoRA {lora.name!r} cannot be loaded into this model: {exc}") from exc
        self._loaded[lora.key] = adapter
        self.loads += 1
        log.info("loaded LoRA %s as %s (%d loaded)", lora.name, adapter, len(self._loaded))

    def _adapter_names(self) -> set[str]:
        return {name for names in self.pipe.get_list_adapters().values() for name in names}
