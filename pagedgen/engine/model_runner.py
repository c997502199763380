from typing import NamedTuple

import torch
from torch import nn

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.engine.scheduler import SchedulerOutput
from pagedgen.engine.sequence import Sequence
from pagedgen.layers.sampler import Sampler, SamplerOutput, SamplingMetadata


class StepInputs(NamedTuple):
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    metadata: AttentionMetadata
    last_rows: list[int]  # per sequence, the row of its last token


class ModelRunner:
    """Owns the model and the KV pool; the one place where scheduled sequences become tensors.

    The pool holds, for every layer, K and V as [num_blocks, block_size, num_kv_heads, head_dim]:

        kv_cache[layer, 0 | 1, block_id, offset, kv_head, :]   (0 = K, 1 = V)

    Token position p of a sequence lives at block block_table[p // block_size], offset
    p % block_size, i.e. in flat slot block_table[p // block_size] * block_size + p % block_size.
    The CPU swap pool, cpu_cache, has the same layout with num_cpu_blocks blocks.
    """

    def __init__(
        self,
        model: nn.Module,
        backend: AttentionBackend,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        num_cpu_blocks: int = 0,
    ) -> None:
        self.model = model
        self.backend = backend
        self.block_size = block_size
        self.device = device
        layers = model.attention_layers
        head = layers[0]
        shape = (len(layers), 2, num_blocks, block_size, head.num_kv_heads, head.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=device)
        for i, attention in enumerate(layers):
            attention.key_cache, attention.value_cache = self.kv_cache[i, 0], self.kv_cache[i, 1]
        cpu_shape = (*shape[:2], num_cpu_blocks, *shape[3:])
        self.cpu_cache = torch.zeros(cpu_shape, dtype=dtype, pin_memory=device.type == "cuda")
        self.sampler = Sampler()

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * dtype.itemsize

    def prepare(self, seqs: list[Sequence], num_new_tokens: list[int]) -> StepInputs:
        """Flattens the step's sequences. Leading single-token sequences form the decode batch."""
        block_size = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        context_lens: list[int] = []
        cu_seqlens_q = [0]
        num_decode_seqs = 0
        for seq, num_new in zip(seqs, num_new_tokens):
            start = seq.num_computed_tokens
            end = start + num_new
            if num_new == 1 and end == seq.num_tokens:
                num_decode_seqs += num_decode_seqs == len(context_lens)
                input_ids.append(seq.last_token_id)
            else:
                input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            table = seq.block_table
            slot_mapping.extend(
                table[p // block_size] * block_size + p % block_size for p in range(start, end)
            )
            context_lens.append(end)
            cu_seqlens_q.append(cu_seqlens_q[-1] + num_new)
        max_num_blocks = max(len(seq.block_table) for seq in seqs)
        block_tables = [
            seq.block_table + [0] * (max_num_blocks - len(seq.block_table)) for seq in seqs
        ]

        def tensor(data: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(data, dtype=dtype, pin_memory=self.device.type == "cuda").to(
                self.device, non_blocking=True
            )

        metadata = AttentionMetadata(
            slot_mapping=tensor(slot_mapping, torch.int64),
            cu_seqlens_q=tensor(cu_seqlens_q, torch.int32),
            context_lens=tensor(context_lens, torch.int32),
            block_tables=tensor(block_tables, torch.int32),
            max_seqlen_q=max(num_new_tokens),
            max_context_len=max(context_lens),
            num_decode_seqs=num_decode_seqs,
            query_lens_cpu=list(num_new_tokens),
            context_lens_cpu=context_lens,
        )
        last_rows = [end - 1 for end in cu_seqlens_q[1:]]
        return StepInputs(
            tensor(input_ids, torch.int64), tensor(positions, torch.int64), metadata, last_rows
        )

    @torch.inference_mode()
    def execute(self, scheduled: SchedulerOutput) -> tuple[list[Sequence], SamplerOutput]:
        """Moves blocks as scheduled, runs one step, and samples the next token of every
        sequence whose prompt is complete after it. Returns those sequences and their samples."""
        self.move_blocks(scheduled)
        computed = [(s, n) for s, n in zip(scheduled.seqs, scheduled.num_new_tokens) if n]
        computed.sort(key=lambda item: item[1] != 1)  # decodes first, stable
        seqs, num_new_tokens = [s for s, _ in computed], [n for _, n in computed]
        inputs = self.prepare(seqs, num_new_tokens)
        last_row = {s.seq_id: row for s, row in zip(seqs, inputs.last_rows)}
        sampled: list[Sequence] = []
        rows: list[int] = []
        owner = None
        for seq, num_new in zip(scheduled.seqs, scheduled.num_new_tokens):
            owner = seq if num_new else owner  # forked siblings sample from the row before them
            if seq.num_computed_tokens + num_new == seq.num_tokens:
                sampled.append(seq)
                rows.append(last_row[owner.seq_id])
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.metadata)
        if not sampled:
            return sampled, SamplerOutput([], None)
        logits = self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)])
        sampling = SamplingMetadata.build(
            [seq.sampling_params for seq in sampled],
            [seq.prompt_token_ids for seq in sampled],
            [seq.output_token_ids for seq in sampled],
            self.device,
        )
        return sampled, self.sampler(logits, sampling)

    def move_blocks(self, scheduled: SchedulerOutput) -> None:
        """Swap-outs first: their device blocks may be reused by this very step."""
        layers = list(self.kv_cache)
        if scheduled.blocks_to_swap_out:
            self.backend.swap_blocks(layers, list(self.cpu_cache), scheduled.blocks_to_swap_out)
        if scheduled.blocks_to_swap_in:
            self.backend.swap_blocks(list(self.cpu_cache), layers, scheduled.blocks_to_swap_in)
        if scheduled.blocks_to_copy:
            self.backend.copy_blocks(layers, scheduled.blocks_to_copy)
