"""Draft tokens in a step's sample rows, and their verification; plain Python, no torch."""

from dataclasses import dataclass
from typing import NamedTuple

from pagedgen.core.scheduler_output import SchedulerOutput
from pagedgen.core.sequence import Sequence


class SampleRows(NamedTuple):
    """A step's sample rows: each one's row of hidden states, its sequence, and the output
    tokens before the token it samples (its drafts so far included)."""

    rows: list[int]
    seqs: list[Sequence]
    output_token_ids: list[list[int]]


def sample_rows(scheduled: SchedulerOutput, last_rows: list[int]) -> SampleRows:
    """One row per sample_seqs entry, at its last token; a sequence with k drafts samples from
    its last k + 1 rows, as though each draft had been appended: the logits, the penalties, the
    bans of min_tokens and bad words, and a seeded row's generator are those the same position
    has without drafts."""
    rows = [last_rows[row] for row in scheduled.sample_rows]
    seqs = scheduled.sample_seqs
    outputs = [seq.output_token_ids for seq in seqs]
    spec = scheduled.spec_token_ids
    if not spec:
        return SampleRows(rows, seqs, outputs)
    expanded = SampleRows([], [], [])
    for last, seq, output in zip(rows, seqs, outputs):
        drafts = spec.get(seq.seq_id, [])
        for i in range(len(drafts) + 1):
            expanded.rows.append(last - len(drafts) + i)
            expanded.seqs.append(seq)
            expanded.output_token_ids.append(output + drafts[:i] if i else output)
    return expanded


def num_accepted(drafts: list[int], sampled: list[int]) -> int:
    """How many leading drafts the target sampled itself (sampled[i] from the logits before
    drafts[i]). Keeping them and then sampled[num_accepted] is exact: sampling x ~ p and keeping
    the draft d when x == d is rejection sampling of the one-hot draft distribution (accept with
    probability p(d), else a token from p without d), and the rows' seeds are those of the same
    positions without drafts, so seeded and greedy outputs are unchanged."""
    n = 0
    while n < len(drafts) and sampled[n] == drafts[n]:
        n += 1
    return n


@dataclass(slots=True)
class SpecDecodeStats:
    """Running totals under vLLM's spec_decode metric names."""

    num_drafts: int = 0  # sequence steps that verified drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def draft_acceptance_rate(self) -> float:
        return self.num_accepted_tokens / max(self.num_draft_tokens, 1)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verifying step yields per sequence: its accepted drafts, and one more."""
        return 1 + self.num_accepted_tokens / max(self.num_drafts, 1)

    def summary(self) -> dict[str, int | float]:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "draft_acceptance_rate": round(self.draft_acceptance_rate, 4),
            "mean_acceptance_length": round(self.mean_acceptance_length, 3),
        }

    def record(self, num_drafts: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
