"""Which LoRA adapters a model's slots hold, step by step, and the adapters' weights."""

from collections import OrderedDict
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from pagedgen.kernels.host_copy import to_device
from pagedgen.layers.linear import Linear
from pagedgen.layers.lora import TARGETS, LinearLoRA, LoRAState, LoRAWeights
from pagedgen.loader.lora_adapter import load_adapter
from pagedgen.lora.request import LoRARequest
from pagedgen.models.checkpoint_weights import fused_module

# An adapter's weights by our layer's name: (output part, weights) for each part it adapts.
AdapterWeights = dict[str, list[tuple[int, LoRAWeights]]]


class LoRAManager:
    """The model's adapted layers and which adapter each slot holds; the model runner calls
    begin_step() before every forward, and set_mask() where the step runs adapters.

    Adapters are read from disk when first added (which checks them) and kept in host memory,
    max_cpu_loras of them at most (vLLM's name; default max_loras), the least recently used
    dropped first and read again when a step needs it: a job may name any number of adapters.
    """

    def __init__(
        self,
        model: nn.Module,
        max_loras: int,
        max_rank: int,
        max_num_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
        max_cpu_loras: int | None = None,
    ) -> None:
        self.max_loras, self.max_rank = max_loras, max_rank
        self.max_cpu_loras = max(max_cpu_loras or max_loras, max_loras)
        self.dtype, self.device = dtype, device
        mask = torch.zeros(max_num_tokens, max_loras, dtype=dtype, device=device)
        self.state = LoRAState(mask)
        self.layers: dict[str, LinearLoRA] = {}
        for name, module in model.named_modules():
            adapted = name.rpartition(".")[2] in TARGETS and "experts" not in name
            if isinstance(module, Linear) and adapted:
                module.lora = LinearLoRA(module, max_loras, max_rank, self.state)
                self.layers[name] = module.lora
        self.requests: dict[int, LoRARequest] = {}  # every adapter added, by lora_int_id
        self.loaded: OrderedDict[int, AdapterWeights] = OrderedDict()  # least recent first
        self.num_loads = 0
        self.slots: list[int] = [0] * max_loras  # each slot's adapter id, 0: none
        self.last_used = [0] * max_loras
        self.num_steps = 0

    def add(self, request: LoRARequest) -> None:
        """Registers an adapter, read (and checked) at once; raises ValueError if it cannot run
        here. A lora_int_id names one adapter for the engine's life."""
        known = self.requests.get(request.lora_int_id)
        if known is not None:
            if known.lora_path != request.lora_path:
                raise ValueError(f"lora_int_id {request.lora_int_id} is already {known.lora_path}")
            return
        self._load(request)
        self.requests[request.lora_int_id] = request

    def _load(self, request: LoRARequest) -> AdapterWeights:
        weights: AdapterWeights = {}
        for module, module_weights in load_adapter(request.lora_path, self.max_rank).items():
            for name, part, part_weights in self._resolve(module, module_weights, request):
                weights.setdefault(name, []).append((part, part_weights))
        self.num_loads += 1
        self.loaded[request.lora_int_id] = weights
        while len(self.loaded) > self.max_cpu_loras:
            self.loaded.popitem(last=False)
        return weights

    def _weights(self, lora_id: int) -> AdapterWeights:
        weights = self.loaded.get(lora_id)
        if weights is None:
            return self._load(self.requests[lora_id])
        self.loaded.move_to_end(lora_id)
        return weights

    def _resolve(
        self, module: str, weights: LoRAWeights, request: LoRARequest
    ) -> Iterable[tuple[str, int, LoRAWeights]]:
        """(our layer, output part, weights) for one of the adapter's modules: one part of a
        fused projection, or each part of a module the checkpoint fuses too (Phi-3's qkv_proj),
        sharing A."""
        name, part = fused_module(module)
        layer = self.layers.get(name)
        if layer is None:
            raise ValueError(
                f"LoRA adapter {request.lora_name!r} adapts {module}, which pagedgen cannot "
                f"adapt (only the decoder layers' attention and dense MLP projections)"
            )
        if part is not None:
            parts = [(part, weights)]
        elif weights.lora_b.shape[0] == sum(layer.output_sizes):
            b_parts = weights.lora_b.split(layer.output_sizes, dim=0)
            parts = [
                (p, LoRAWeights(weights.lora_a, b, weights.scaling)) for p, b in enumerate(b_parts)
            ]
        else:
            raise ValueError(f"LoRA adapter {request.lora_name!r}: {module} has the wrong shape")
        for part, part_weights in parts:
            _check_shape(part_weights, layer, part, module, request)
            yield name, part, part_weights

    def begin_step(self, lora_ids: list[int]) -> list[int] | None:
        """Loads the adapters of a step's sequences (their lora_int_id, 0 for none) into slots;
        returns lora_ids if the step runs any adapter, else None. The adapted layers read which
        (LoRAState.active)."""
        self.num_steps += 1
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
            weights = self._weights(lora_id)
            for name, layer in self.layers.items():
                layer.set_slot(slot, weights.get(name, []))
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
