"""LoRA on a model's Linear layers, for several adapters in one batch.

Each adapted Linear holds max_loras slots of its adapters' matrices: lora_a's columns are, for
each output part (q, k, v of a fused QKV projection) and then each slot, max_lora_rank columns
of A; lora_b[part] the matching rows of B, scaled. With mask [num_tokens, max_loras] one-hot
on each token's slot (all zero for the base model), a layer adds, for each part,

    ((x @ lora_a) * mask, over each slot's columns)[part's columns] @ lora_b[part]

to the part's output columns: each token's own adapter's scaling * B @ A @ x, and nothing for
the others. The shapes do not depend on which adapters a step holds, so the same ops run in
CUDA and CPU graphs, whose replays read the mask from the one buffer LoRAManager fills before
every step. A step whose tokens all run the base model skips the ops (LoRAState.active).
"""

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pagedgen.engine.sequence import Sequence
from pagedgen.engine.transfer import to_device
from pagedgen.layers.linear import Linear
from pagedgen.lora.adapter import LoRAWeights, load_adapter
from pagedgen.lora.request import LoRARequest
from pagedgen.models.llama import STACKED_PARAMS

# The Linear layers adapters may adapt: every decoder layer's projections (not MoE experts,
# which see only their routed tokens, nor lm_head).
TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass
class LoRAState:
    """What every adapted layer of a model reads in a forward: mask [max_num_tokens, max_loras]
    (its first rows are the step's tokens), and whether the step runs any adapter at all."""

    mask: torch.Tensor
    active: bool = False


class LinearLoRA:
    def __init__(self, linear: Linear, max_loras: int, max_rank: int, state: LoRAState) -> None:
        dtype, device = state.mask.dtype, state.mask.device
        self.output_sizes = linear.output_sizes
        self.max_loras, self.max_rank = max_loras, max_rank
        self.part_width = max_loras * max_rank
        num_parts = len(self.output_sizes)
        self.lora_a = torch.zeros(
            linear.in_features, num_parts * self.part_width, dtype=dtype, device=device
        )
        self.lora_b = [
            torch.zeros(self.part_width, size, dtype=dtype, device=device)
            for size in self.output_sizes
        ]
        starts = np.cumsum([0, *self.output_sizes[:-1]]).tolist()
        self.spans = [(start, start + size) for start, size in zip(starts, self.output_sizes)]
        self.state = state

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not self.state.active:
            return y
        n, num_parts = x.shape[0], len(self.lora_b)
        xa = torch.mm(x, self.lora_a).view(n, num_parts, self.max_loras, self.max_rank)
        xa.mul_(self.state.mask[:n, None, :, None])
        xa = xa.view(n, num_parts, self.part_width)
        if num_parts == 1:
            return y.addmm_(xa[:, 0], self.lora_b[0])
        for part, (start, end) in enumerate(self.spans):
            y[:, start:end].addmm_(xa[:, part], self.lora_b[part])
        return y

    def set_slot(self, slot: int, parts: list[tuple[int, LoRAWeights]]) -> None:
        """Writes an adapter's matrices for output parts into slot (zero where it has none)."""
        rows = slice(slot * self.max_rank, (slot + 1) * self.max_rank)
        for part in range(len(self.lora_b)):
            self.lora_a[:, part * self.part_width :][:, rows].zero_()
            self.lora_b[part][rows].zero_()
        for part, weights in parts:
            rank = weights.lora_a.shape[0]
            col = part * self.part_width + slot * self.max_rank
            self.lora_a[:, col : col + rank].copy_(weights.lora_a.T)
            row = slot * self.max_rank
            self.lora_b[part][row : row + rank].copy_(weights.lora_b.T * weights.scaling)


class LoRAManager:
    """The model's adapted layers and which adapter each slot holds; the model runner calls
    prepare() before every forward with the step's sequences."""

    def __init__(
        self,
        model: nn.Module,
        max_loras: int,
        max_rank: int,
        max_num_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.max_loras, self.max_rank = max_loras, max_rank
        self.dtype, self.device = dtype, device
        mask = torch.zeros(max_num_tokens, max_loras, dtype=dtype, device=device)
        self.state = LoRAState(mask)
        self.layers: dict[str, LinearLoRA] = {}
        for name, module in model.named_modules():
            adapted = name.rpartition(".")[2] in TARGETS and "experts" not in name
            if isinstance(module, Linear) and adapted:
                module.lora = LinearLoRA(module, max_loras, max_rank, self.state)
                self.layers[name] = module.lora
        self.adapters: dict[int, tuple[LoRARequest, dict[str, list[tuple[int, LoRAWeights]]]]] = {}
        self.slots: list[int] = [0] * max_loras  # each slot's adapter id, 0: none
        self.last_used = [0] * max_loras
        self.num_steps = 0

    def add(self, request: LoRARequest) -> None:
        """Loads an adapter (once per lora_int_id); raises ValueError if it cannot run here."""
        known = self.adapters.get(request.lora_int_id)
        if known is not None:
            if known[0].lora_path != request.lora_path:
                raise ValueError(
                    f"lora_int_id {request.lora_int_id} is already {known[0].lora_path}"
                )
            return
        parts: dict[str, list[tuple[int, LoRAWeights]]] = {}
        for module, weights in load_adapter(request.lora_path, self.max_rank).items():
            for name, part, part_weights in self._resolve(module, weights, request):
                parts.setdefault(name, []).append((part, _on(part_weights, self.device)))
        self.adapters[request.lora_int_id] = (request, parts)

    def _resolve(
        self, module: str, weights: LoRAWeights, request: LoRARequest
    ) -> Iterable[tuple[str, int, LoRAWeights]]:
        """(our layer, output part, weights) for one of the adapter's modules."""
        name = module.removeprefix("model.")
        prefix, _, proj = name.rpartition(".")
        if proj in STACKED_PARAMS and f"{prefix}.{STACKED_PARAMS[proj][0]}" in self.layers:
            fused, part = STACKED_PARAMS[proj]
            layer = self.layers[f"{prefix}.{fused}"]
            _check_shape(weights, layer, part, module, request)
            yield f"{prefix}.{fused}", part, weights
            return
        layer = self.layers.get(name)
        if layer is None:
            raise ValueError(
                f"LoRA adapter {request.lora_name!r} adapts {module}, which pagedgen cannot "
                f"adapt (only the decoder layers' attention and dense MLP projections)"
            )
        b_parts = weights.lora_b.split(layer.output_sizes, dim=0)
        if weights.lora_b.shape[0] != sum(layer.output_sizes):
            raise ValueError(f"LoRA adapter {request.lora_name!r}: {module} has the wrong shape")
        for part, b in enumerate(b_parts):
            part_weights = LoRAWeights(weights.lora_a, b, weights.scaling)
            _check_shape(part_weights, layer, part, module, request)
            yield name, part, part_weights

    def begin_step(self, seqs: list[Sequence]) -> list[int] | None:
        """Loads the adapters of a step's sequences into slots; returns their adapter ids (0 for
        none) if the step runs any, else None. The adapted layers read which
        (LoRAState.active)."""
        self.num_steps += 1
        lora_ids = [seq.lora_int_id for seq in seqs]
        ids = {i for i in lora_ids if i}
        self.slot_of = self._assign_slots(ids) if ids else {}
        self.state.active = bool(ids)
        return lora_ids if ids else None

    def set_mask(self, lora_ids: list[int], num_new_tokens: list[int], num_rows: int) -> None:
        """Sets the mask's first num_rows rows: the sequences' tokens in order (num_new_tokens
        each), then zero rows (graph padding)."""
        seq_slots = np.array([self.slot_of.get(i, -1) for i in lora_ids], dtype=np.int64)
        token_slots = np.repeat(seq_slots, num_new_tokens)
        host = np.zeros((num_rows, self.max_loras), dtype=np.float32)
        adapted = np.flatnonzero(token_slots >= 0)
        host[adapted, token_slots[adapted]] = 1.0
        self.state.mask[:num_rows].copy_(to_device(host, self.dtype, self.device))

    def _assign_slots(self, ids: set[int]) -> dict[int, int]:
        """Each adapter's slot, loading those not resident into the least recently used slots
        no adapter of this step holds."""
        assert len(ids) <= self.max_loras, "the scheduler admits at most max_loras adapters"
        slot_of = {lora_id: slot for slot, lora_id in enumerate(self.slots) if lora_id in ids}
        free = sorted(
            (s for s in range(self.max_loras) if self.slots[s] not in ids),
            key=lambda s: self.last_used[s],
        )
        for lora_id in sorted(ids - set(slot_of)):
            slot = free.pop(0)
            _, parts = self.adapters[lora_id]
            for name, layer in self.layers.items():
                layer.set_slot(slot, parts.get(name, []))
            self.slots[slot] = lora_id
            slot_of[lora_id] = slot
        for slot in slot_of.values():
            self.last_used[slot] = self.num_steps
        return slot_of


def _check_shape(
    weights: LoRAWeights, layer: LinearLoRA, part: int, module: str, request: LoRARequest
) -> None:
    shape = (weights.lora_b.shape[0], weights.lora_a.shape[1])
    expected = (layer.output_sizes[part], layer.lora_a.shape[0])
    if shape != expected:
        raise ValueError(
            f"LoRA adapter {request.lora_name!r}: {module} maps {shape[1]} features to "
            f"{shape[0]}, where this model's maps {expected[1]} to {expected[0]}"
        )


def _on(weights: LoRAWeights, device: torch.device) -> LoRAWeights:
    return LoRAWeights(weights.lora_a.to(device), weights.lora_b.to(device), weights.scaling)
