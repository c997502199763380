"""Host to device copies that never make the host wait for the device."""

from collections.abc import Sequence

import numpy as np
import torch


def to_device(
    data: np.ndarray | Sequence, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """data as a tensor on device. On a GPU the copy is queued on the current stream from pinned
    memory, which torch's caching host allocator keeps until the copy has run: a plain
    torch.tensor(data, device=...) would first wait for all the work queued before it."""
    if isinstance(data, np.ndarray):
        tensor = torch.from_numpy(data).to(dtype)
    else:
        tensor = torch.tensor(data, dtype=dtype)
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
