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

from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from pagedgen.kernels import cpu_gemm, cpu_gemm_bf16
from pagedgen.layers.linear import Linear

# The Linear layers adapters may adapt: every decoder layer's projections (not MoE experts,
# which see only their routed tokens, nor lm_head).
TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass(frozen=True)
class LoRAWeights:
    """One adapted module: its output gains scaling * x @ lora_a.T @ lora_b.T."""

    lora_a: torch.Tensor  # [rank, in_features]
    lora_b: torch.Tensor  # [out_features, rank]
    scaling: float


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
        # On a CPU, the panel kernel of the model's Linear layers, over packed copies of A and
        # B (repacked in place when a slot changes, so recorded CPU graphs keep reading them):
        # torch's matmuls run these thin shapes 1.3-2.5x slower.
        self.kernel = _panel_kernel(dtype, device)
        self.packed_a: torch.Tensor | None = None
        self.packed_b: list[torch.Tensor] = []
        self._pack()

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not self.state.active:
            return y
        n, num_parts = x.shape[0], len(self.lora_b)
        if self.kernel is not None:
            xa = self.kernel.linear(x, self.packed_a, None, self.lora_a.shape[1])
        else:
            xa = torch.mm(x, self.lora_a)
        xa = xa.view(n, num_parts, self.max_loras, self.max_rank)
        xa.mul_(self.state.mask[:n, None, :, None])
        xa = xa.view(n, num_parts, self.part_width)
        for part, (start, end) in enumerate(self.spans):
            out = y if num_parts == 1 else y[:, start:end]
            if self.kernel is not None:
                out.add_(self.kernel.linear(xa[:, part], self.packed_b[part], None, end - start))
            else:
                out.addmm_(xa[:, part], self.lora_b[part])
        return y

    def set_slot(self, slot: int, parts: list[tuple[int, LoRAWeights]]) -> None:
        """Writes an adapter's matrices for output parts into slot (zero where it has none)."""
        row = slot * self.max_rank  # the slot's rows of each lora_b, columns of each part's A
        for part in range(len(self.lora_b)):
            col = part * self.part_width + row
            self.lora_a[:, col : col + self.max_rank].zero_()
            self.lora_b[part][row : row + self.max_rank].zero_()
        for part, weights in parts:
            rank = weights.lora_a.shape[0]
            col = part * self.part_width + row
            self.lora_a[:, col : col + rank].copy_(weights.lora_a.T)
            self.lora_b[part][row : row + rank].copy_(weights.lora_b.T * weights.scaling)
        self._pack()

    def _pack(self) -> None:
        if self.kernel is None:
            return
        packed_a = self.kernel.pack(self.lora_a.t().contiguous())
        packed_b = [self.kernel.pack(b.t().contiguous()) for b in self.lora_b]
        if self.packed_a is None:
            self.packed_a, self.packed_b = packed_a, packed_b
            return
        self.packed_a.copy_(packed_a)
        for old, new in zip(self.packed_b, packed_b):
            old.copy_(new)


def _panel_kernel(dtype: torch.dtype, device: torch.device) -> ModuleType | None:
    """cpu_gemm (float32) or cpu_gemm_bf16 where it runs for dtype on device, else None."""
    if device.type != "cpu":
        return None
    if dtype == torch.float32 and cpu_gemm.enabled():
        return cpu_gemm
    if dtype == torch.bfloat16 and cpu_gemm_bf16.enabled():
        return cpu_gemm_bf16
    return None
