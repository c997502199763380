import weakref

import numpy as np
import torch
from torch import nn

from pagedgen.attention import AttentionBackend
from pagedgen.core.kv_geometry import KVGeometry
from pagedgen.core.runner import PendingOutput, ReadyOutput, SamplerOutput, WithPromptLogprobs
from pagedgen.core.scheduler_output import SchedulerOutput
from pagedgen.core.sequence import Sequence
from pagedgen.core.spec_verify import sample_rows
from pagedgen.core.step_timer import StepTimer
from pagedgen.kernels.host_copy import to_device
from pagedgen.lora.request import LoRARequest
from pagedgen.worker.block_table import BlockTables
from pagedgen.worker.cuda_graphs import DecodeGraphs
from pagedgen.worker.lora_manager import LoRAManager
from pagedgen.worker.piecewise_graphs import PiecewiseGraphs
from pagedgen.worker.placeholders import LastSamples, find_placeholders
from pagedgen.worker.pooler import PooledPrompt, Pooler, PromptChunk
from pagedgen.worker.prompt_logprobs import compute_prompt_logprobs
from pagedgen.worker.sampler import Sampler
from pagedgen.worker.sampling_metadata import SamplingMetadata
from pagedgen.worker.step_inputs import StepArrays, StepInputs


class ModelRunner:
    """Owns the model and the KV pool; the one place where scheduled sequences become tensors.

    The pool holds, for every layer, K and V as [num_blocks, block_size, num_kv_heads, head_dim]:

        kv_cache[layer, 0 | 1, block_id, offset, kv_head, :]   (0 = K, 1 = V)

    (An MLA model's pool has one tensor a layer, its latent, bound as both K and V.)

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
        self.max_num_seqs = max_num_seqs
        self.decode_graphs: DecodeGraphs | None = None
        self.lora_decode_graphs: DecodeGraphs | None = None  # for steps that run adapters
        self.piecewise_graphs: PiecewiseGraphs | None = None  # other steps without adapters
        # The last step's sampled token ids, on the device, and the sequences that sampled them.
        self.last_sampled: LastSamples | None = None
        self.lora: LoRAManager | None = None  # set by model_setup where LoRA is enabled
        self.pooler: Pooler | None = None  # a pooling runner's (embeddings): it samples nothing
        self.num_blocks, self.has_pad_block = 0, False
        self.kv_cache = torch.empty(0)
        self.cpu_cache = torch.empty(0)

    def allocate_kv_cache(
        self, num_blocks: int, num_cpu_blocks: int, pad_block: bool = False
    ) -> None:
        """(Re)creates the device pool and the CPU swap pool and binds the model's layers. With
        pad_block, the device pool has one block more, block num_blocks, for graph padding."""
        for attention in self.model.attention_layers:  # the old pools go first
            attention.key_cache = attention.value_cache = None
        self.kv_cache = self.cpu_cache = torch.empty(0)
        self.num_blocks, self.has_pad_block = num_blocks, pad_block
        on_gpu = self.device.type == "cuda"
        shape = self.geometry.cache_shape(num_blocks + pad_block, self.block_size)
        new = torch.zeros if on_gpu else torch.empty
        self.kv_cache = new(shape, dtype=self.kv_cache_dtype, device=self.device)
        for i, attention in enumerate(self.model.attention_layers):
            attention.key_cache, attention.value_cache = self.kv_cache[i, 0], self.kv_cache[i, -1]
        cpu_shape = self.geometry.cache_shape(num_cpu_blocks, self.block_size)
        self.cpu_cache = torch.empty(cpu_shape, dtype=self.kv_cache_dtype, pin_memory=on_gpu)

    def add_lora(self, request: LoRARequest) -> None:
        if self.lora is None:
            raise ValueError("this engine was built without LoRA: pass enable_lora=True")
        self.lora.add(request)

    def prepare_arrays(self, scheduled: SchedulerOutput) -> StepArrays:
        """Flattens the step's sequences in the scheduler's order (decodes first), in array
        operations over the batch; block tables come from the persistent BlockTables."""
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
        input_ids = [seq.last_token_id for seq in seqs[:num_decode]]
        spec = scheduled.spec_token_ids
        for seq, start, end in zip(
            seqs[num_decode:], starts[num_decode:].tolist(), context_lens[num_decode:].tolist()
        ):
            input_ids.extend(seq.token_ids[start:end])
            if spec and end > seq.num_tokens:
                input_ids.extend(spec[seq.seq_id])
        input_ids = np.array(input_ids, dtype=np.int64)
        return StepArrays(
            input_ids,
            positions,
            slot_mapping,
            context_lens,
            cu_seqlens_q,
            rows,
            self._find_placeholders(input_ids, seqs, cu_seqlens_q),
        )

    def _find_placeholders(
        self, input_ids: np.ndarray, seqs: list[Sequence], cu_seqlens_q: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        return find_placeholders(input_ids, seqs, cu_seqlens_q, self.last_sampled)

    def prepare(self, scheduled: SchedulerOutput) -> StepInputs:
        """The step's tensors on the device, for an eager forward."""
        arrays = self.prepare_arrays(scheduled)
        inputs = arrays.to_device(scheduled, self.block_tables.table, self.block_size, self.device)
        if arrays.placeholders is not None:
            self.last_sampled.fill(inputs.input_ids, arrays.placeholders)
        return inputs

    def forward(self, scheduled: SchedulerOutput) -> tuple[torch.Tensor, list[int]]:
        """The final hidden states of the step's tokens and each sequence's last row: by a
        graph replay for a step of decodes (drafts as decode rows: StepArrays.decode_rows) that
        fits one, by piecewise graphs for another step without adapters that fits theirs, else
        eagerly."""
        lora_ids = None
        if self.lora is not None:
            lora_ids = self.lora.begin_step([seq.lora_int_id for seq in scheduled.seqs])
        graphs = self.decode_graphs if lora_ids is None else self.lora_decode_graphs
        num_seqs = len(scheduled.seqs)
        num_tokens = scheduled.num_batched_tokens if scheduled.spec_token_ids else num_seqs
        if (
            graphs is not None
            and scheduled.num_decode_seqs + len(scheduled.spec_token_ids) == num_seqs
            and num_tokens <= graphs.max_batch_size
        ):
            with self.timer.section("prepare_inputs"):
                arrays = self.prepare_arrays(scheduled)
                rows, context_lens = arrays.decode_rows()
                batch_size = graphs.fill(
                    arrays.input_ids,
                    arrays.positions,
                    arrays.slot_mapping,
                    context_lens,
                    self.block_tables.table,
                    rows,
                )
                if arrays.placeholders is not None:
                    self.last_sampled.fill(graphs.input_ids, arrays.placeholders)
                if lora_ids is not None:
                    self.lora.set_mask(lora_ids, scheduled.num_new_tokens, batch_size)
            with self.timer.section("model_forward"):
                return graphs.replay(batch_size, num_tokens), arrays.last_rows
        piecewise = self.piecewise_graphs
        if (
            piecewise is not None
            and lora_ids is None
            and scheduled.num_batched_tokens <= piecewise.max_num_tokens
        ):
            with self.timer.section("prepare_inputs"):
                arrays = self.prepare_arrays(scheduled)
                table, device = self.block_tables.table, self.device
                metadata = arrays.metadata(scheduled, table, self.block_size, device)
                batch_size = piecewise.fill(arrays.input_ids, arrays.positions, arrays.slot_mapping)
                if arrays.placeholders is not None:
                    self.last_sampled.fill(piecewise.input_ids, arrays.placeholders)
                self.backend.prepare(metadata)
            with self.timer.section("model_forward"):
                hidden = piecewise.replay(batch_size, metadata, len(arrays.input_ids))
            return hidden, arrays.last_rows
        with self.timer.section("prepare_inputs"):
            inputs = self.prepare(scheduled)
            self.backend.prepare(inputs.metadata)
            if lora_ids is not None:
                self.lora.set_mask(lora_ids, scheduled.num_new_tokens, len(inputs.input_ids))
        with self.timer.section("model_forward"):
            hidden = self.model(inputs.input_ids, inputs.positions, inputs.metadata)
        return hidden, inputs.last_rows

    def execute(self, scheduled: SchedulerOutput) -> SamplerOutput:
        return self.execute_async(scheduled).result()

    @torch.inference_mode()
    def execute_async(self, scheduled: SchedulerOutput) -> PendingOutput:
        """Runs one step and samples it (sample); with the prompt logprobs its prefill rows
        computed for sequences that ask for them, brought to the host at once. A pooling
        runner pools the prompts the step completes instead."""
        self.move_blocks(scheduled)
        hidden, last_rows = self.forward(scheduled)
        if self.pooler is not None:
            with self.timer.section("sampler"):
                embeddings = self.pool(hidden, scheduled, last_rows)
            return ReadyOutput(SamplerOutput([], None, pooler_output=embeddings))
        with self.timer.section("sampler"):
            prompt_logprobs = compute_prompt_logprobs(
                self.model.compute_logits, hidden, scheduled, last_rows
            )
        pending = self.sample(scheduled, hidden, last_rows)
        return pending if prompt_logprobs is None else WithPromptLogprobs(pending, prompt_logprobs)

    def pool(
        self, hidden: torch.Tensor, scheduled: SchedulerOutput, last_rows: list[int]
    ) -> list[torch.Tensor]:
        """The pooler's vectors for the prompts the step completes; it sees ids and rows only.
        A sequence that dies unfinished has its partial sum freed (finalize)."""
        assert self.pooler is not None
        chunks = []
        for seq, start, n in zip(
            scheduled.seqs, scheduled.num_computed_tokens, scheduled.num_new_tokens
        ):
            chunks.append(PromptChunk(seq.seq_id, start, n))
            if self.pooler.accumulates and start == 0:
                weakref.finalize(seq, self.pooler.free, seq.seq_id)
        finished = [
            PooledPrompt(seq.seq_id, last_rows[row], seq.num_prompt_tokens, seq.pooling_params)
            for seq, row in zip(scheduled.sample_seqs, scheduled.sample_rows)
        ]
        return self.pooler.pool(hidden, chunks, finished)

    def sample(
        self, scheduled: SchedulerOutput, hidden: torch.Tensor, last_rows: list[int]
    ) -> PendingOutput:
        """Samples the next token of every sequence in scheduled.sample_seqs, in that order (and
        one more for each draft: spec_decode.verify.sample_rows), from logits the grammar bitmask
        (if any) has masked first: greedy, temperature, top-k/p and penalties see only allowed
        tokens. The samples stay on the device for the next step's placeholders."""
        timer = self.timer
        with timer.section("model_forward"):
            if not scheduled.sample_seqs:
                return ReadyOutput(SamplerOutput([], None))
            rows, sampled, outputs = sample_rows(scheduled, last_rows)
            if rows != list(range(len(hidden))):  # a decode-only step samples every row
                hidden = hidden[to_device(rows, torch.int64, self.device)]
            logits = self.model.compute_logits(hidden)
        if scheduled.grammar_bitmask is not None:
            with timer.section("structured_output"):
                scheduled.grammar_bitmask.apply_(logits)
        with timer.section("sampling_metadata"):
            sampling = SamplingMetadata.build(
                [seq.sampling_params for seq in sampled],
                [seq.prompt_token_ids for seq in sampled],
                outputs,
                self.device,
                logits.shape[1],
            )
        with timer.section("sampler"):
            samples = self.sampler.sample(logits, sampling)
        # Async scheduling, which never drafts, reads each sequence's one sample on the device.
        self.last_sampled = (
            None if scheduled.spec_token_ids else LastSamples(samples.token_ids, sampled)
        )
        return samples

    def move_blocks(self, scheduled: SchedulerOutput) -> None:
        """Swap-outs first: their device blocks may be reused by this very step."""
        layers = list(self.kv_cache)
        if scheduled.blocks_to_swap_out:
            self.backend.swap_blocks(layers, list(self.cpu_cache), scheduled.blocks_to_swap_out)
        if scheduled.blocks_to_swap_in:
            self.backend.swap_blocks(list(self.cpu_cache), layers, scheduled.blocks_to_swap_in)
        if scheduled.blocks_to_copy:
            self.backend.copy_blocks(layers, scheduled.blocks_to_copy)
