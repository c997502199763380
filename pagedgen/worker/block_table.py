import numpy as np

from pagedgen.core.sequence import Sequence, SequenceStatus


class BlockTables:
    """The running sequences' block tables as rows of one persistent int32 array, the model
    runner's copy of what the block manager decides (vLLM V1's worker-side BlockTable).

    A sequence keeps its row while it runs. Each step, sync() copies into a row only the entries
    the block manager wrote since the last sync: block_table[seq.num_synced_blocks:], usually
    nothing or the one block just appended, so a step's host work follows what changed, not how
    long the sequences are. Entries past a sequence's table are 0.

    Rows of sequences that stopped running (finished, preempted, or a warm-up's) are reclaimed
    when no row is free; rows are keyed by the Sequence itself, since seq ids repeat across
    schedulers (the warm-up's and the engine's).
    """

    def __init__(self, num_rows: int, max_num_blocks_per_seq: int) -> None:
        self.table = np.zeros((num_rows, max_num_blocks_per_seq), dtype=np.int32)
        self.row_of: dict[Sequence, int] = {}
        self.free_rows = list(range(num_rows - 1, -1, -1))

    @property
    def max_num_blocks_per_seq(self) -> int:
        return self.table.shape[1]

    def sync(self, seqs: list[Sequence]) -> np.ndarray:
        """Brings the rows of seqs up to date; returns their row indices, in order."""
        rows = np.empty(len(seqs), dtype=np.int64)
        for i, seq in enumerate(seqs):
            row = self.row_of.get(seq)
            if row is None:
                row = self._assign(seq, seqs)
            synced, n = seq.num_synced_blocks, len(seq.block_table)
            if synced < n:
                self._write(row, synced, seq.block_table[synced:])
            elif synced > n:  # the table was replaced by a shorter one: rewrite it all
                self._write(row, 0, seq.block_table)
            seq.num_synced_blocks = n
            rows[i] = row
        return rows

    def _write(self, row: int, start: int, block_ids: list[int]) -> None:
        end = start + len(block_ids)
        if end > self.table.shape[1]:
            raise ValueError(
                f"a block table of {end} blocks is longer than max_num_blocks_per_seq "
                f"({self.table.shape[1]})"
            )
        if len(block_ids) == 1:
            self.table[row, start] = block_ids[0]
        else:
            self.table[row, start:end] = block_ids
        if start == 0:  # a whole table: clear what a longer one left past it
            self.table[row, end:] = 0

    def _assign(self, seq: Sequence, step_seqs: list[Sequence]) -> int:
        if not self.free_rows:
            self._reclaim(keep=set(step_seqs))
        row = self.free_rows.pop()
        self.row_of[seq] = row
        seq.num_synced_blocks = 0  # a fresh row holds none of seq's table
        return row

    def _reclaim(self, keep: set[Sequence]) -> None:
        """Frees the rows of sequences that are not running, except keep's (this step's);
        doubles the array if that frees none."""
        for seq, row in list(self.row_of.items()):
            if seq.status is not SequenceStatus.RUNNING and seq not in keep:
                del self.row_of[seq]
                self.free_rows.append(row)
        if not self.free_rows:
            num_rows, width = self.table.shape
            self.table = np.concatenate([self.table, np.zeros_like(self.table)])
            self.free_rows = list(range(2 * num_rows - 1, num_rows - 1, -1))
        self.free_rows.sort(reverse=True)  # lowest rows first: the live rows stay dense
