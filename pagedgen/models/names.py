import re
from collections.abc import Iterable, Iterator, Sequence

import torch


def renamed(
    weights: Iterable[tuple[str, torch.Tensor]],
    rules: Sequence[tuple[str, str]],
    skip: str | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint's tensors under our module names: each (pattern, replacement) rule applied
    in order with re.sub; names that match skip (buffers some checkpoints save, as GPT-2's
    attention masks) are left out."""
    compiled = [(re.compile(pattern), replacement) for pattern, replacement in rules]
    for name, tensor in weights:
        if skip is not None and re.search(skip, name):
            continue
        for pattern, replacement in compiled:
            name = pattern.sub(replacement, name)
        yield name, tensor
