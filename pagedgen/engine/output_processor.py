import time

from pagedgen.core.ngram_proposer import NgramProposer
from pagedgen.core.request import Request
from pagedgen.core.runner import SamplerOutput
from pagedgen.core.scheduler import Scheduler
from pagedgen.core.scheduler_output import SchedulerOutput
from pagedgen.core.sequence import Sequence, SequenceStatus
from pagedgen.core.spec_verify import SpecDecodeStats, num_accepted
from pagedgen.core.stop_checker import StopChecker
from pagedgen.engine.structured_output.manager import StructuredOutputManager
from pagedgen.spec_decode.config import SpeculativeConfig


class OutputProcessor:
    """Applies a step's samples to its sequences: appends each sampled token (or resolves the
    placeholder that stood for it under async scheduling), detokenizes and stops the sequence,
    advances its grammar or its beam search, and frees what finished.

    A sequence an earlier step finished (or an abort) keeps no sample: under async scheduling
    it was scheduled again before the host knew it had finished.

    With speculative_config, a sequence that drafted keeps its drafts up to the first one its
    samples disagree with, then that sample, each token stopped like any other; every sequence
    still running then proposes its drafts for the next step.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        stop_checker: StopChecker,
        structured_output: StructuredOutputManager,
        speculative_config: SpeculativeConfig | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.stop_checker = stop_checker
        self.structured_output = structured_output
        self.proposer = None if speculative_config is None else NgramProposer(speculative_config)
        self.spec_decode_stats = SpecDecodeStats()

    def process(
        self, scheduled: SchedulerOutput, samples: SamplerOutput, requests: dict[str, Request]
    ) -> tuple[int, list[Request]]:
        """Returns how many samples were kept, and the requests that finished, in order."""
        if samples.pooler_output is not None:
            return 0, self._finish_pooled(scheduled, samples.pooler_output, requests)
        for item in samples.prompt_logprobs or ():
            request = requests.get(scheduled.seqs[item.seq_index].request_id)
            if request is not None:
                request.add_prompt_logprobs(item.first_position, item.entries)
        num_sampled = 0
        beam_rows: dict[str, dict[int, dict[int, float]]] = {}
        queued_finished = False  # a sequence preempted (waiting or swapped) finished
        finishing: dict[str, int] = {}  # request id -> where the sequence that finished samples
        token_ids, all_logprobs = samples.token_ids, samples.logprobs
        check, finish = self.stop_checker.check, self.scheduler.finish
        spec, proposer = scheduled.spec_token_ids, self.proposer
        max_model_len = self.stop_checker.max_model_len
        k = proposer.num_drafts_at(len(scheduled.seqs)) if proposer is not None else 0
        row = 0  # the next sequence's first sample row
        for index, seq in enumerate(scheduled.sample_seqs):
            first, drafts = row, spec.get(seq.seq_id) if spec else None
            row += 1 + len(drafts) if drafts else 1
            if seq.is_finished:
                continue
            if drafts:
                num_sampled += self._accept(seq, drafts, samples, first)
                if seq.is_finished:
                    finish(seq)
                    finishing[seq.request_id] = index
                elif proposer is not None:
                    seq.spec_token_ids = proposer.propose_for(seq, max_model_len, k)
                continue
            num_sampled += 1
            logprobs = all_logprobs[first] if all_logprobs is not None else None
            if seq.num_output_placeholders:
                seq.resolve_placeholder(token_ids[first], logprobs)
            elif requests[seq.request_id].beam is not None:
                beam_rows.setdefault(seq.request_id, {})[seq.seq_id] = logprobs
                continue
            else:
                seq.append_token_id(token_ids[first], logprobs)
            status = seq.status
            if seq.sampling_params.structured_outputs is None:
                check(seq)
            else:
                self._check_structured_stop(seq)
            if seq.is_finished:
                finish(seq)
                finishing[seq.request_id] = index
                queued_finished |= status is not SequenceStatus.RUNNING
            elif proposer is not None:
                seq.spec_token_ids = proposer.propose_for(seq, max_model_len, k)
        for request_id, rows in beam_rows.items():
            request = requests[request_id]
            request.beam.step(request.group, rows, self.scheduler)
        if not finishing and not beam_rows:  # most steps: no group finished
            return num_sampled, []
        self.scheduler.remove_finished_groups(queued=queued_finished)
        return num_sampled, _finished_requests(scheduled, requests, finishing, bool(beam_rows))

    def _finish_pooled(
        self, scheduled: SchedulerOutput, pooled: list, requests: dict[str, Request]
    ) -> list[Request]:
        """A pooling step's prompts that completed are done: each keeps its pooled vector."""
        finished = []
        for seq, vector in zip(scheduled.sample_seqs, pooled):
            request = requests.get(seq.request_id)
            if seq.is_finished or request is None:  # aborted meanwhile
                continue
            request.pooled = vector
            seq.first_token_time = time.monotonic()
            seq.finish(SequenceStatus.FINISHED_STOPPED)
            self.scheduler.finish(seq)
            finished.append(request)
        self.scheduler.remove_finished_groups()
        return finished

    def _accept(self, seq: Sequence, drafts: list[int], samples: SamplerOutput, first: int) -> int:
        """Appends the drafts seq's samples (rows first, first + 1, ...) agree with and the next
        sample, stopping at the first that finishes it; uncounts the rejected drafts' K/V.
        Returns how many tokens it appended."""
        token_ids, logprobs = samples.token_ids, samples.logprobs
        sampled = token_ids[first : first + len(drafts) + 1]
        accepted = num_accepted(drafts, sampled)
        self.spec_decode_stats.record(len(drafts), accepted)
        for j, token_id in enumerate(sampled[: accepted + 1]):
            seq.append_token_id(token_id, logprobs[first + j] if logprobs is not None else None)
            self.stop_checker.check(seq)
            if seq.is_finished:
                return j + 1
        self.scheduler.reject_drafts(seq, len(drafts) - accepted)
        return accepted + 1

    def _check_structured_stop(self, seq: Sequence) -> None:
        """Advances the grammar of a structured output sequence by its new token; then stops it
        when it must: a complete grammar stops it, a failed one ends it with the error."""
        grammar = self.structured_output.advance(seq)
        if grammar.error is not None:
            self.stop_checker.finish(seq, SequenceStatus.FINISHED_IGNORED, error=grammar.error)
        else:
            self.stop_checker.check(seq, grammar_terminated=grammar.is_terminated)


def _finished_requests(
    scheduled: SchedulerOutput,
    requests: dict[str, Request],
    finishing: dict[str, int],
    beams: bool,
) -> list[Request]:
    """The requests that finished, in the order of their first sample in the step. A group's
    samples are scheduled together, one after another, so the index of the one that finished
    (finishing: request id -> it) orders them; a beam step can finish any request it sampled."""
    if beams:
        candidates = dict.fromkeys(seq.request_id for seq in scheduled.sample_seqs)
    else:
        candidates = sorted(finishing, key=finishing.__getitem__)
    finished = []
    for request_id in candidates:
        request = requests.get(request_id)
        if request is not None and request.is_finished:
            finished.append(request)
    return finished
