"""LoRA adapters: requests of one batch may each run with their own (vLLM's multi-LoRA)."""

from pagedgen.lora.request import LoRARequest

__all__ = ["LoRARequest"]
