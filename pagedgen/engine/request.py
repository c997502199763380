from dataclasses import dataclass

from pagedgen.engine.sequence import Sequence
from pagedgen.outputs import CompletionOutput, RequestMetrics, RequestOutput


@dataclass(slots=True)
class Request:
    """A user's request: one prompt and the n sequences sampled from it."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence]

    @property
    def is_finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)

    def output(self, tokenizer) -> RequestOutput:
        completions = []
        for index, seq in enumerate(self.seqs):
            logprobs = seq.output_logprobs or None
            cumulative = None
            if logprobs is not None:
                cumulative = sum(lp[t] for lp, t in zip(logprobs, seq.output_token_ids))
            completions.append(
                CompletionOutput(
                    index=index,
                    text=seq.output_text,
                    token_ids=list(seq.output_token_ids),
                    cumulative_logprob=cumulative,
                    logprobs=logprobs,
                    finish_reason=seq.finish_reason,
                    stop_reason=seq.stop_reason,
                )
            )
        first = [seq.first_token_time for seq in self.seqs if seq.first_token_time is not None]
        done = [seq.finished_time for seq in self.seqs if seq.finished_time is not None]
        metrics = RequestMetrics(
            arrival_time=min(seq.arrival_time for seq in self.seqs),
            first_token_time=min(first) if first else None,
            finished_time=max(done) if done else None,
        )
        errors = [seq.error for seq in self.seqs if seq.error]
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=completions,
            metrics=metrics,
            error=errors[0] if errors else None,
        )
