import numpy as np
import torch


def apply_token_bitmask_(
    logits: torch.Tensor,  # [num_seqs, vocab_size] float
    bitmask: torch.Tensor,  # [len(rows), ceil(vocab_size / 32)] int32, on the CPU
    rows: list[int],  # the row of logits each bitmask row masks
) -> None:
    """Sets to -inf, in place, the logits of the tokens a row's bitmask leaves out.

    Bit j of word w allows token 32 * w + j (little-endian: the low bit of the first byte is
    token 0), the layout llguidance and xgrammar fill.
    """
    num_seqs, vocab_size = logits.shape
    assert bitmask.dtype == torch.int32 and bitmask.shape[0] == len(rows), bitmask.shape
    assert bitmask.shape[1] * 32 >= vocab_size, (bitmask.shape, vocab_size)
    banned = unpack_banned(bitmask, vocab_size, logits.device)
    if len(rows) == num_seqs and rows == list(range(num_seqs)):
        logits.masked_fill_(banned, float("-inf"))
        return
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(banned, float("-inf"))


def unpack_banned(bitmask: torch.Tensor, vocab_size: int, device: torch.device) -> torch.Tensor:
    """The [rows, vocab_size] bool mask of the tokens the bitmask leaves out."""
    if device.type == "cpu":  # numpy's table-driven unpack is a few times faster than shifts
        bits = np.unpackbits(
            bitmask.numpy().view(np.uint8), axis=1, count=vocab_size, bitorder="little"
        )
        return torch.from_numpy(bits).view(torch.bool).logical_not_()
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    words = bitmask.to(device, non_blocking=True).unsqueeze(-1)
    allowed = ((words >> shifts) & 1).flatten(1)[:, :vocab_size]
    return allowed == 0
