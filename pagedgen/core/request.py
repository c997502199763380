from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pagedgen.core.beam_search import BeamSearchParams, BeamSearchState
from pagedgen.core.logprobs import as_logprobs
from pagedgen.core.sequence import Sequence, SequenceGroup
from pagedgen.lora.request import LoRARequest
from pagedgen.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    RequestMetrics,
    RequestOutput,
)
from pagedgen.pooling.params import PoolingParams, dimensions_refusal
from pagedgen.sampling_params import SamplingParams, first_outside_vocabulary


@dataclass(slots=True)
class Request:
    """A user's request: one prompt, its sequence group, and the beam search state if any."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    group: SequenceGroup
    beam: BeamSearchState | None = None
    # With prompt_logprobs: entry p for prompt token p, as far as computed (None for token 0).
    prompt_logprobs: list[dict[int, float] | None] = field(default_factory=lambda: [None])
    lora_request: LoRARequest | None = None
    pooling_params: PoolingParams | None = None  # an embedding request's
    pooled: Any = None  # a pooling request's vector (a float32 tensor), once computed

    @property
    def is_finished(self) -> bool:
        return self.group.is_finished

    @property
    def needs_sync_steps(self) -> bool:
        """Whether each step must wait for the tokens of the last, which the host needs: it
        picks beams, advances grammars, counts penalized tokens and matches bad words."""
        params = self.group.sampling_params
        return (
            self.beam is not None
            or params.structured_outputs is not None
            or bool(params.bad_words)
            or params.repetition_penalty != 1.0
            or bool(params.presence_penalty or params.frequency_penalty)
        )

    def refusal(self, vocab_size: int, hf_config: Any) -> str | None:
        """Why it cannot run on an engine of this vocabulary and model, known before it is
        scheduled: a token id past the vocabulary, dimensions the model cannot give."""
        bad = first_outside_vocabulary(self.group.seqs[0].prompt_token_ids, vocab_size)
        if bad is not None and vocab_size:
            return f"prompt token {bad} is outside the vocabulary of {vocab_size}"
        if self.pooling_params is not None:
            return dimensions_refusal(self.pooling_params, hf_config)
        outside = self.group.sampling_params.token_outside(vocab_size)
        return None if outside is None else f"token {outside} is outside the vocabulary"

    def add_prompt_logprobs(self, first_position: int, entries: list[dict[int, float]]) -> None:
        """entries[i] is prompt token first_position + i's; a recomputed prompt (after a
        preemption) brings again what is already here, which stays."""
        known = len(self.prompt_logprobs)
        assert first_position <= known, "prompt logprobs arrive in position order"
        self.prompt_logprobs.extend(entries[known - first_position :])

    @property
    def is_started(self) -> bool:
        """Whether any of its tokens was ever computed (a recompute preemption keeps outputs)."""
        return any(seq.num_computed_tokens or seq.output_token_ids for seq in self.group.seqs)

    def output(self, tokenizer) -> RequestOutput | PoolingRequestOutput:
        if self.pooling_params is not None:
            return self._pooling_output()
        if self.beam is not None:
            completions = self._beam_completions(tokenizer)
        else:
            completions = [_completion(i, seq) for i, seq in enumerate(self.group.seqs)]
        errors = [seq.error for seq in self.group.seqs if seq.error]
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=completions,
            metrics=self._metrics(),
            error=errors[0] if errors else None,
            num_cached_tokens=self.group.num_cached_tokens or 0,
            prompt_logprobs=[None if e is None else as_logprobs(e) for e in self.prompt_logprobs]
            if self.group.sampling_params.prompt_logprobs is not None
            else None,
            lora_request=self.lora_request,
        )

    def _metrics(self) -> RequestMetrics:
        seqs = self.group.seqs
        first = [seq.first_token_time for seq in seqs if seq.first_token_time is not None]
        done = [seq.finished_time for seq in seqs if seq.finished_time is not None]
        return RequestMetrics(
            arrival_time=self.group.arrival_time,
            first_token_time=min(first) if first else None,
            finished_time=max(done) if done else None,
        )

    def _pooling_output(self) -> PoolingRequestOutput:
        seq = self.group.seqs[0]
        vector = [] if self.pooled is None else self.pooled.tolist()
        classify = self.pooling_params.task == "classify"
        output_cls = ClassificationRequestOutput if classify else EmbeddingRequestOutput
        return output_cls(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=ClassificationOutput(vector) if classify else EmbeddingOutput(vector),
            metrics=self._metrics(),
            error=seq.error,
            num_cached_tokens=self.group.num_cached_tokens or 0,
        )

    def _beam_completions(self, tokenizer) -> list[CompletionOutput]:
        completions = []
        for index, hypothesis in enumerate(self.beam.best(self.group)):
            completions.append(
                CompletionOutput(
                    index=index,
                    text=""
                    if tokenizer is None
                    else tokenizer.decode(hypothesis.token_ids, skip_special_tokens=True),
                    token_ids=hypothesis.token_ids,
                    cumulative_logprob=hypothesis.cumulative_logprob,
                    finish_reason="stop" if hypothesis.finished_by_eos else "length",
                )
            )
        return completions


def build_request(
    new_sequence: Callable[..., Sequence],  # Scheduler.new_sequence: it hands out the ids
    tokenizer: Any,
    eos_token_ids: set[int],
    request_id: str,
    prompt: str | list[int],
    params: SamplingParams | BeamSearchParams | PoolingParams | None,
    lora_request: LoRARequest | None = None,
    arrival_time: float | None = None,
) -> Request:
    """A prompt (text, tokenized here, or token ids) and its parameters as a request: its
    sequence group of one sequence, with what the engine derives from the tokenizer. An
    embedding request (PoolingParams) samples nothing: its SamplingParams only size it."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("this engine has no tokenizer: give prompts as token ids")
        text, token_ids = prompt, tokenizer.encode(prompt)
    else:
        text, token_ids = None, list(prompt)
    beam, pooling_params = None, None
    if isinstance(params, PoolingParams):
        pooling_params, token_ids = params, params.truncated(token_ids)
        sampling_params = SamplingParams(max_tokens=1, detokenize=False)
    elif isinstance(params, BeamSearchParams):
        beam = BeamSearchState(params, eos_token_ids)
        sampling_params = params.sampling_params()
    else:
        sampling_params = params or SamplingParams()
        token_ids = sampling_params.truncated(token_ids)
        sampling_params = sampling_params.for_engine(tokenizer, eos_token_ids)
    lora_int_id = lora_request.lora_int_id if lora_request is not None else 0
    seq = new_sequence(request_id, token_ids, sampling_params, arrival_time, lora_int_id)
    seq.pooling_params = pooling_params
    beam_width = params.beam_width if beam is not None else None
    group = SequenceGroup(request_id, seq, sampling_params, beam_width)
    return Request(
        request_id,
        text,
        token_ids,
        group,
        beam,
        lora_request=lora_request,
        pooling_params=pooling_params,
    )


def _completion(index: int, seq: Sequence) -> CompletionOutput:
    logprobs = seq.output_logprobs or None
    cumulative = None
    if logprobs is not None:
        cumulative = sum(lp[t] for lp, t in zip(logprobs, seq.output_token_ids))
    return CompletionOutput(
        index=index,
        text=seq.output_text,
        token_ids=list(seq.output_token_ids),
        cumulative_logprob=cumulative,
        logprobs=None if logprobs is None else [as_logprobs(entry) for entry in logprobs],
        finish_reason=seq.finish_reason,
        stop_reason=seq.stop_reason,
    )
