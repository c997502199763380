"""One shard of an input, for N independent processes (Slurm arrays, Kubernetes Jobs): shard I/N
takes every record whose 0-based position in the input (its line less one; a dataset's row) is
I modulo N, so the N shards partition the input and `pagedgen merge` puts it back in order."""

from collections.abc import Iterator
from typing import NamedTuple

from pagedgen.entrypoints.io.records import InputRecord


class Shard(NamedTuple):
    index: int
    count: int

    def holds(self, record: InputRecord) -> bool:
        return (record.line - 1) % self.count == self.index

    def size_of(self, total: int) -> int:
        """How many of the positions 0..total-1 fall in this shard."""
        return max(0, (total - self.index + self.count - 1) // self.count)

    def filter(self, records: Iterator[InputRecord]) -> Iterator[InputRecord]:
        return (record for record in records if self.holds(record))


def parse_shard(text: str) -> Shard:
    """'I/N' with 0 <= I < N; raises ValueError naming the option otherwise."""
    index, sep, count = text.partition("/")
    if not (sep and index.strip().isdigit() and count.strip().isdigit()):
        raise ValueError(f"shard must be I/N (as 0/4), got {text!r}")
    shard = Shard(int(index), int(count))
    if not 0 <= shard.index < shard.count:
        raise ValueError(f"shard must be I/N with 0 <= I < N, got {text!r}")
    return shard
