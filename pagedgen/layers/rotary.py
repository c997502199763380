import copy
from typing import NamedTuple

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def rope_parameters(config: PretrainedConfig) -> dict:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    params = dict(params or {})
    params.setdefault("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params


def pairs_to_halves(head_dim: int, start: int, rotary_dim: int) -> torch.Tensor:
    """The order of a head's features that turns its rotary_dim rotary ones from start, laid out
    in interleaved pairs (x0, x1), (x2, x3), ... (GLM's, DeepSeek's), into the halves
    rotate_half takes: x0, x2, ..., then x1, x3, ...; the others stay. A checkpoint's q and k
    projection rows reordered so (reorder_heads) rotate as ours do; the same permutation of both
    leaves every attention score as it was."""
    order = torch.arange(head_dim)
    pairs = torch.cat([torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2)])
    order[start : start + rotary_dim] = start + pairs
    return order


def reorder_heads(tensor: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """A projection's weight or bias rows, head by head (len(order) rows each), in order."""
    return tensor.view(-1, len(order), *tensor.shape[1:])[:, order].reshape(tensor.shape)


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding (Hugging Face's rotate_half) over a precomputed table.

    The inverse frequencies and the attention scaling come from transformers' own rope
    functions, so every scaling variant a config names is computed as the reference computes it.
    With a partial_rotary_factor (Phi-4-mini's 0.75, GLM-4.5's 0.5; the config's or, in
    transformers 5, its rope_parameters') only the first head_dim * factor features
    of each head rotate; the rest pass through.
    """

    def __init__(self, config: PretrainedConfig, head_dim: int, max_position: int) -> None:
        super().__init__()
        rope_type = rope_parameters(config)["rope_type"]
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"rope_type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}"
            )
        if rope_type == "default":
            params = rope_parameters(config)
            factor = params.get(
                "partial_rotary_factor", getattr(config, "partial_rotary_factor", 1)
            )
            theta, dim = params["rope_theta"], int(head_dim * factor)
            inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            scaling = 1.0
        else:
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
        freqs = rope_angles(inv_freq, max_position)
        self.register_buffer("cos", freqs.cos() * scaling, persistent=False)
        self.register_buffer("sin", freqs.sin() * scaling, persistent=False)

    def forward(self, positions: torch.Tensor) -> "Rope":
        """The step's cos and sin rows, looked up once and shared by every layer."""
        return Rope(self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1))


def rope_angles(inv_freq: torch.Tensor, max_position: int) -> torch.Tensor:
    """[max_position, len(inv_freq)]: each position times each frequency, on the default device
    (a model built for CUDA builds its tables there; inv_freq may come from the CPU)."""
    positions = torch.arange(max_position, dtype=torch.float)
    return positions[:, None] * inv_freq.float().to(positions.device)[None, :]


def layer_type_ropes(config: PretrainedConfig, head_dim: int, max_position: int) -> nn.ModuleDict:
    """A rotary table per kind of layer ("full_attention", "sliding_attention"), each from its
    own entry of a rope_parameters given by layer type (Gemma 3, OLMo 3), else both alike."""
    params = config.rope_parameters
    ropes = {}
    for kind in ("full_attention", "sliding_attention"):
        layer_config = copy.copy(config)
        layer_config.rope_parameters = dict(params.get(kind, params))
        ropes[kind] = RotaryEmbedding(layer_config, head_dim, max_position)
    return nn.ModuleDict(ropes)


class Rope(NamedTuple):
    cos: torch.Tensor  # [num_tokens, 1, rotary_dim // 2], float32
    sin: torch.Tensor

    @property
    def rotary_dim(self) -> int:
        return 2 * self.cos.shape[-1]

    def apply(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        rotary_dim = self.rotary_dim
        x1, x2 = x[..., :rotary_dim].float().chunk(2, dim=-1)
        out = torch.cat((x1 * self.cos - x2 * self.sin, x2 * self.cos + x1 * self.sin), dim=-1)
        if rotary_dim < x.shape[-1]:
            return torch.cat((out.to(x.dtype), x[..., rotary_dim:]), dim=-1)
        return out.to(x.dtype)
