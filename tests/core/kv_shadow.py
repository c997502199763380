"""A shadow KV cache for control-plane tests: which token prefix each slot's K/V was computed
from, moved as the model runner moves blocks, and checked where attention would read it."""

from pagedgen.core.runner import NullRunner, SamplerOutput
from pagedgen.core.scheduler_output import SchedulerOutput
from pagedgen.core.sequence import Sequence
from pagedgen.engine.llm_engine import LLMEngine

Contents = list[int | None]  # per slot of a block: hash of the token prefix whose K/V it holds


def prefix_hashes(seq: Sequence, num_tokens: int, drafts: list[int] | None = None) -> list[int]:
    """K/V at position p depend on (token_ids + drafts)[: p + 1]: one chained hash per position."""
    hashes, h = [], seq.lora_int_id  # a LoRA adapter computes other K/V from the same tokens
    for token in (seq.token_ids + (drafts or []))[:num_tokens]:
        h = hash((h, token))
        hashes.append(h)
    return hashes


class KVShadow:
    def __init__(self, block_size: int, num_blocks: int, num_cpu_blocks: int = 0) -> None:
        self.block_size = block_size
        self.device: list[Contents] = [[None] * block_size for _ in range(num_blocks)]
        self.cpu: list[Contents] = [[None] * block_size for _ in range(num_cpu_blocks)]

    def swap_out(self, mapping: list[tuple[int, int]]) -> None:
        for device_id, cpu_id in mapping:
            self.cpu[cpu_id] = list(self.device[device_id])

    def swap_in(self, mapping: list[tuple[int, int]]) -> None:
        for cpu_id, device_id in mapping:
            self.device[device_id] = list(self.cpu[cpu_id])

    def copy(self, mapping: list[tuple[int, int]]) -> None:
        for src, dst in mapping:
            self.device[dst] = list(self.device[src])

    def write(
        self, seq: Sequence, start: int, num_new_tokens: int, drafts: list[int] | None = None
    ) -> None:
        hashes = prefix_hashes(seq, start + num_new_tokens, drafts)
        size = self.block_size
        for p in range(start, start + num_new_tokens):
            self.device[seq.block_table[p // size]][p % size] = hashes[p]

    def check(self, seq: Sequence, num_tokens: int, drafts: list[int] | None = None) -> None:
        """Every position below num_tokens holds its own prefix's K/V (drafts after the
        tokens)."""
        size = self.block_size
        for p, expected in enumerate(prefix_hashes(seq, num_tokens, drafts)):
            block_id = seq.block_table[p // size]
            assert self.device[block_id][p % size] == expected, (
                f"{seq} reads position {p} from block {block_id}, which holds another prefix"
            )

    def run_step(self, scheduled: SchedulerOutput) -> None:
        """Moves blocks, writes the step's K/V, then checks every context attention reads."""
        self.swap_out(scheduled.blocks_to_swap_out)
        self.swap_in(scheduled.blocks_to_swap_in)
        self.copy(scheduled.blocks_to_copy)
        steps = list(zip(scheduled.seqs, scheduled.num_computed_tokens, scheduled.num_new_tokens))
        spec = scheduled.spec_token_ids
        for seq, start, n in steps:
            self.write(seq, start, n, spec.get(seq.seq_id, []))
        for seq, start, n in steps:
            self.check(seq, start + n, spec.get(seq.seq_id))


class ShadowRunner(NullRunner):
    """Samples token 7 for everyone, keeps a KVShadow, and remembers the last step."""

    def __init__(self, block_size: int, num_blocks: int, num_cpu_blocks: int = 0) -> None:
        super().__init__(lambda seq: 7)
        self.shadow = KVShadow(block_size, num_blocks, num_cpu_blocks)
        self.last: SchedulerOutput | None = None
        self.num_steps = 0

    def execute(self, scheduled: SchedulerOutput) -> SamplerOutput:
        self.shadow.run_step(scheduled)
        self.last = scheduled
        self.num_steps += 1
        return super().execute(scheduled)


def run_step(engine: LLMEngine) -> SchedulerOutput | None:
    """One engine step; the block manager's invariants hold after it. Returns what ran, or None
    when nothing was scheduled."""
    runner = engine.runner
    before = runner.num_steps
    engine.step()
    engine.block_manager.check_integrity()
    return runner.last if runner.num_steps > before else None
