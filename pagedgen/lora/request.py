from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """A LoRA adapter a request runs with (vLLM's LoRARequest): a PEFT folder holding
    adapter_config.json and adapter_model.safetensors. lora_int_id names the adapter within an
    engine: requests with the same id share its loaded weights and their prefix-cache blocks."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be >= 1, got {self.lora_int_id}")
