from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.engine.block_table import BlockTables
from pagedgen.engine.kv_geometry import KVGeometry
from pagedgen.engine.runner import SamplerOutput
from pagedgen.engine.scheduler_output import SchedulerOutput
from pagedgen.engine.step_timer import StepTimer
from pagedgen.layers.sampler import Sampler, SamplingMetadata


class StepInputs(NamedTuple):
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    metadata: AttentionMetadata
    last_rows: list[int]  # per scheduled sequence, the row of its last token


class ModelRunner:
    """Owns the model and the KV pool; the one place where scheduled sequences become tensors.

    The pool holds, for every layer, K and V as [num_blocks, block_size, num_kv_heads, head_dim]:

        kv_cache[layer, 0 | 1, block_id, offset, kv_head, :]   (0 = K, 1 = V)

    Token position p of a sequence lives at block block_table[p // block_size], offset
    p % block_size, i.e. in flat slot block_table[p // block_size] * block_size + p % block_size.
    The CPU swap pool, cpu_cache, has the same layout with num_cpu_blocks blocks.

    On the CPU the pool is allocated uninitialised: pages are touched (and count in RSS) only as
    blocks are written, and no kernel reads a slot past a sequence's context. On a GPU it is
    zeroed, as the batched torch decode path multiplies masked slots by zero weights.
    """

    def __init__(
        self,
        model: nn.Module,
        backend: AttentionBackend,
        geometry: KVGeometry,
        block_size: int,
        device: torch.device,
        kv_cache_dtype: torch.dtype,
        seed: int = 0,
        *,
        max_model_len: int = 8192,
        max_num_seqs: int = 256,
    ) -> None:
        self.model = model
        self.backend = backend
        self.geometry = geometry
        self.block_size = block_size
        self.device = device
        self.kv_cache_dtype = kv_cache_dtype
        # Rows without a per-request seed draw from this engine's own generator.
        self.sampler = Sampler(torch.Generator(device).manual_seed(seed))
        self.timer = StepTimer()
        # Twice the running sequences' rows: the rows of finished ones are reclaimed in bulk.
        self.block_tables = BlockTables(2 * max_num_seqs, -(-max_model_len // block_size))
        self.kv_cache = torch.empty(0)
        self.cpu_cache = torch.empty(0)

    def allocate_kv_cache(self, num_blocks: int, num_cpu_blocks: int) -> None:
        """(Re)creates the device pool and the CPU swap pool and binds the model's layers."""
        self.kv_cache = self.cpu_cache = torch.empty(0)  # the old pools go first
        on_gpu = self.device.type == "cuda"
        shape = self.geometry.cache_shape(num_blocks, self.block_size)
        new = torch.zeros if on_gpu else torch.empty
        self.kv_cache = new(shape, dtype=self.kv_cache_dtype, device=self.device)
        for i, attention in enumerate(self.model.attention_layers):
            attention.key_cache, attention.value_cache = self.kv_cache[i, 0], self.kv_cache[i, 1]
        cpu_shape = self.geometry.cache_shape(num_cpu_blocks, self.block_size)
        self.cpu_cache = torch.empty(cpu_shape, dtype=self.kv_cache_dtype, pin_memory=on_gpu)

    def prepare(self, scheduled: SchedulerOutput) -> StepInputs:
        """Flattens the step's sequences in the scheduler's order (decodes first). Block tables
        and slots come from the persistent BlockTables, in array operations over the batch."""
        block_size = self.block_size
        seqs = scheduled.seqs
        num_decode = scheduled.num_decode_seqs
        rows = self.block_tables.sync(seqs)
        starts = np.array(scheduled.num_computed_tokens, dtype=np.int64)
        query_lens = np.array(scheduled.num_new_tokens, dtype=np.int64)
        context_lens = starts + query_lens
        cu_seqlens_q = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(query_lens, out=cu_seqlens_q[1:])
        num_tokens = int(cu_seqlens_q[-1])
        if num_tokens == len(seqs):  # one token a sequence: every decode step
            positions, token_rows = starts, rows
        else:
            token_seq = np.repeat(np.arange(len(seqs)), query_lens)
            positions = np.arange(num_tokens) + (starts - cu_seqlens_q[:-1])[token_seq]
            token_rows = rows[token_seq]
        table = self.block_tables.table
        slot_mapping = table[token_rows, positions // block_size] * block_size
        slot_mapping = slot_mapping.astype(np.int64) + positions % block_size
        max_context_len = int(context_lens.max())
        block_tables = table[rows, : -(-max_context_len // block_size)]
        input_ids = [seq.last_token_id for seq in seqs[:num_decode]]
        for seq, start, end in zip(
            seqs[num_decode:], starts[num_decode:].tolist(), context_lens[num_decode:].tolist()
        ):
            input_ids.extend(seq.token_ids[start:end])

        def tensor(data: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            t = torch.from_numpy(data).to(dtype)
            if self.device.type == "cuda":
                t = t.pin_memory().to(self.device, non_blocking=True)
            return t

        context_lens_cpu = context_lens.tolist()
        metadata = AttentionMetadata(
            slot_mapping=tensor(slot_mapping, torch.int64),
            cu_seqlens_q=tensor(cu_seqlens_q, torch.int32),
            context_lens=tensor(context_lens, torch.int32),
            block_tables=tensor(block_tables, torch.int32),
            max_seqlen_q=max(scheduled.num_new_tokens),
            max_context_len=max_context_len,
            block_size=block_size,
            num_decode_seqs=num_decode,
            query_lens_cpu=list(scheduled.num_new_tokens),
            context_lens_cpu=context_lens_cpu,
        )
        last_rows = (cu_seqlens_q[1:] - 1).tolist()
        return StepInputs(
            tensor(np.array(input_ids, dtype=np.int64), torch.int64),
            tensor(positions, torch.int64),
            metadata,
            last_rows,
        )

    @torch.inference_mode()
    def execute(self, scheduled: SchedulerOutput) -> SamplerOutput:
        """Moves blocks as scheduled, runs one step, and samples the next token of every sequence
        in scheduled.sample_seqs, in that order, from logits the grammar bitmask (if any) has
        masked first: greedy, temperature, top-k/p and penalties see only allowed tokens."""
        timer = self.timer
        self.move_blocks(scheduled)
        with timer.section("prepare_inputs"):
            inputs = self.prepare(scheduled)
            self.backend.prepare(inputs.metadata)
        with timer.section("model_forward"):
            hidden = self.model(inputs.input_ids, inputs.positions, inputs.metadata)
            if not scheduled.sample_seqs:
                return SamplerOutput([], None)
            rows = [inputs.last_rows[row] for row in scheduled.sample_rows]
            logits = self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)])
        if scheduled.grammar_bitmask is not None:
            with timer.section("structured_output"):
                scheduled.grammar_bitmask.apply_(logits)
        sampled = scheduled.sample_seqs
        with timer.section("sampling_metadata"):
            sampling = SamplingMetadata.build(
                [seq.sampling_params for seq in sampled],
                [seq.prompt_token_ids for seq in sampled],
                [seq.output_token_ids for seq in sampled],
                self.device,
            )
        with timer.section("sampler"):
            return self.sampler(logits, sampling)

    def move_blocks(self, scheduled: SchedulerOutput) -> None:
        """Swap-outs first: their device blocks may be reused by this very step."""
        layers = list(self.kv_cache)
        if scheduled.blocks_to_swap_out:
            self.backend.swap_blocks(layers, list(self.cpu_cache), scheduled.blocks_to_swap_out)
        if scheduled.blocks_to_swap_in:
            self.backend.swap_blocks(list(self.cpu_cache), layers, scheduled.blocks_to_swap_in)
        if scheduled.blocks_to_copy:
            self.backend.copy_blocks(layers, scheduled.blocks_to_copy)
