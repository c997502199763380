from pagedgen.engine.request import Request
from pagedgen.engine.runner import SamplerOutput
from pagedgen.engine.scheduler import Scheduler
from pagedgen.engine.scheduler_output import SchedulerOutput
from pagedgen.engine.sequence import Sequence, SequenceStatus
from pagedgen.engine.stop_checker import StopChecker
from pagedgen.structured_output.manager import StructuredOutputManager


class OutputProcessor:
    """Applies a step's samples to its sequences: appends each sampled token (or resolves the
    placeholder that stood for it under async scheduling), detokenizes and stops the sequence,
    advances its grammar or its beam search, and frees what finished.

    A sequence an earlier step finished (or an abort) keeps no sample: under async scheduling
    it was scheduled again before the host knew it had finished.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        stop_checker: StopChecker,
        structured_output: StructuredOutputManager,
    ) -> None:
        self.scheduler = scheduler
        self.stop_checker = stop_checker
        self.structured_output = structured_output

    def process(
        self, scheduled: SchedulerOutput, samples: SamplerOutput, requests: dict[str, Request]
    ) -> tuple[int, list[Request]]:
        """Returns how many samples were kept, and the requests that finished, in order."""
        for item in samples.prompt_logprobs or ():
            request = requests.get(scheduled.seqs[item.seq_index].request_id)
            if request is not None:
                request.add_prompt_logprobs(item.first_position, item.entries)
        num_sampled = 0
        beam_rows: dict[str, dict[int, dict[int, float]]] = {}
        queued_finished = False  # a sequence preempted (waiting or swapped) finished
        token_ids, all_logprobs = samples.token_ids, samples.logprobs
        check, finish = self.stop_checker.check, self.scheduler.finish
        for i, seq in enumerate(scheduled.sample_seqs):
            if seq.is_finished:
                continue
            num_sampled += 1
            logprobs = all_logprobs[i] if all_logprobs is not None else None
            if seq.num_output_placeholders:
                seq.resolve_placeholder(token_ids[i], logprobs)
            elif requests[seq.request_id].beam is not None:
                beam_rows.setdefault(seq.request_id, {})[seq.seq_id] = logprobs
                continue
            else:
                seq.append_token_id(token_ids[i], logprobs)
            status = seq.status
            if seq.sampling_params.structured_outputs is None:
                check(seq)
            else:
                self._check_structured_stop(seq)
            if seq.is_finished:
                finish(seq)
                queued_finished |= status is not SequenceStatus.RUNNING
        for request_id, rows in beam_rows.items():
            request = requests[request_id]
            request.beam.step(request.group, rows, self.scheduler)
        self.scheduler.remove_finished_groups(queued=queued_finished)
        finished = []
        for request_id in dict.fromkeys(seq.request_id for seq in scheduled.sample_seqs):
            request = requests.get(request_id)
            if request is not None and request.is_finished:
                finished.append(request)
        return num_sampled, finished

    def _check_structured_stop(self, seq: Sequence) -> None:
        """Advances the grammar of a structured output sequence by its new token; then stops it
        when it must: a complete grammar stops it, a failed one ends it with the error."""
        grammar = self.structured_output.advance(seq)
        if grammar.error is not None:
            seq.finish(SequenceStatus.FINISHED_IGNORED, grammar.error)
            self.stop_checker.free(seq)
        else:
            self.stop_checker.check(seq, grammar_terminated=grammar.is_terminated)
