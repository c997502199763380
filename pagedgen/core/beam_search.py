from dataclasses import dataclass, field

from pagedgen.core.scheduler import Scheduler
from pagedgen.core.sequence import SequenceGroup, SequenceStatus
from pagedgen.sampling_params import SamplingParams, StructuredOutputsParams


@dataclass(slots=True)
class BeamSearchParams:
    """Beam search as vLLM's LLM.beam_search runs it (its field names and defaults).

    Every step each live beam proposes its 2 * beam_width most likely next tokens; a proposal
    ending in eos (unless ignore_eos) is set aside as a finished hypothesis, and the beam_width
    best of the others, by beam_search_score, live on. After max_tokens steps the finished
    hypotheses and the live beams compete, and the beam_width best are returned. With
    structured_outputs, beams propose only the tokens their grammar allows.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    length_penalty: float = 1.0
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if self.beam_width < 1 or self.max_tokens < 1:
            raise ValueError(
                f"beam_width and max_tokens must be >= 1, got {self.beam_width}, {self.max_tokens}"
            )

    def sampling_params(self) -> SamplingParams:
        """What each beam asks of the model runner: the raw log-probabilities of its best
        2 * beam_width next tokens (the sampled token itself is not used)."""
        return SamplingParams(
            temperature=0.0,
            max_tokens=self.max_tokens,
            logprobs=2 * self.beam_width,
            structured_outputs=self.structured_outputs,
        )


def beam_search_score(
    num_tokens: int, cumulative_logprob: float, ends_with_eos: bool, length_penalty: float
) -> float:
    """vLLM's get_beam_search_score: the length counts the prompt, and not a final eos."""
    length = num_tokens - 1 if ends_with_eos else num_tokens
    return cumulative_logprob / (length**length_penalty)


@dataclass(slots=True)
class Hypothesis:
    token_ids: list[int]  # generated tokens
    cumulative_logprob: float
    finished_by_eos: bool
    score: float


@dataclass(slots=True)
class BeamSearchState:
    params: BeamSearchParams
    eos_token_ids: set[int]
    finished: list[Hypothesis] = field(default_factory=list)

    def step(
        self,
        group: SequenceGroup,
        logprobs: dict[int, dict[int, float]],  # seq_id -> {token: logprob}
        scheduler: Scheduler,
    ) -> None:
        """Extends the group's beams by one token: forks kept beams by reference, frees dropped
        ones, both through the scheduler. Ends the group (every beam FINISHED_LENGTH_CAPPED) at
        max_tokens, or at max_model_len."""
        params = self.params
        candidates = []
        for beam in group.unfinished_seqs:
            for token, logprob in logprobs[beam.seq_id].items():
                if logprob == float("-inf"):  # a token the beam's grammar does not allow
                    continue
                cumulative = beam.cumulative_logprob + logprob
                ends = token in self.eos_token_ids and not params.ignore_eos
                score = beam_search_score(
                    beam.num_tokens + 1, cumulative, ends, params.length_penalty
                )
                if ends:
                    tokens = beam.output_token_ids + [token]
                    self.finished.append(Hypothesis(tokens, cumulative, True, score))
                else:
                    candidates.append((score, beam, token, cumulative))
        candidates.sort(key=lambda c: c[0], reverse=True)
        kept = candidates[: params.beam_width]
        uses: dict[int, int] = {}
        for _, beam, _, _ in kept:
            uses[beam.seq_id] = uses.get(beam.seq_id, 0) + 1
        survivors = []
        for beam in group.unfinished_seqs:
            if beam.seq_id not in uses:
                beam.status = SequenceStatus.FINISHED_ABORTED
                scheduler.finish(beam)
        taken: set[int] = set()
        for _, beam, token, cumulative in kept:
            if beam.seq_id in taken:  # a second child of the same beam: fork it, share blocks
                child = scheduler.fork(beam)
                child.token_ids.pop()
                child.output_token_ids.pop()
                beam = child
            taken.add(beam.seq_id)
            beam.append_token_id(token)
            beam.cumulative_logprob = cumulative
            survivors.append(beam)
        group.seqs = survivors
        if (
            not survivors
            or survivors[0].num_output_tokens >= params.max_tokens
            or survivors[0].num_tokens >= scheduler.max_model_len
        ):
            for beam in survivors:
                beam.finish(SequenceStatus.FINISHED_LENGTH_CAPPED)
                scheduler.finish(beam)

    def best(self, group: SequenceGroup) -> list[Hypothesis]:
        params = self.params
        hypotheses = list(self.finished)
        for beam in group.seqs:
            score = beam_search_score(
                beam.num_tokens, beam.cumulative_logprob, False, params.length_penalty
            )
            hypotheses.append(
                Hypothesis(list(beam.output_token_ids), beam.cumulative_logprob, False, score)
            )
        hypotheses.sort(key=lambda h: h.score, reverse=True)
        return hypotheses[: params.beam_width]
