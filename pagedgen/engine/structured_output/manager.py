import time
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, NamedTuple

from pagedgen.core.sequence import Sequence
from pagedgen.engine.structured_output import INSTALL_HINT, is_backend_installed
from pagedgen.engine.structured_output.grammar import Matcher, SequenceGrammar, common_prefix_len
from pagedgen.engine.structured_output.reasoning_gate import ReasoningGate, reasoning_markers
from pagedgen.sampling_params import StructuredOutputsParams

MAX_CACHED_GRAMMARS = 256


@dataclass(slots=True)
class StructuredOutputStats:
    num_grammars_compiled: int = 0
    num_compile_cache_hits: int = 0
    backend_setup_time_s: float = 0.0  # the tokenizer's setup, once, on the compile thread
    compile_time_s: float = 0.0  # summed over compiles, on the compile thread
    num_masked_steps: int = 0
    num_masked_rows: int = 0
    bitmask_fill_time_s: float = 0.0  # the grammar engine's next-token masks
    bitmask_apply_time_s: float = 0.0  # setting the banned logits to -inf

    def summary(self) -> dict[str, Any]:
        steps = max(self.num_masked_steps, 1)
        return {
            "num_grammars_compiled": self.num_grammars_compiled,
            "num_grammar_cache_hits": self.num_compile_cache_hits,
            "grammar_compile_ms_mean": round(
                1e3 * self.compile_time_s / max(self.num_grammars_compiled, 1), 3
            ),
            "grammar_mask_ms_per_step": round(
                1e3 * (self.bitmask_fill_time_s + self.bitmask_apply_time_s) / steps, 3
            ),
            "grammar_fill_ms_per_step": round(1e3 * self.bitmask_fill_time_s / steps, 3),
            "mean_masked_rows": round(self.num_masked_rows / steps, 1),
        }


@dataclass(slots=True)
class GrammarBitmask:
    """The allowed next tokens of a step's constrained rows, which the runner applies to the
    logits before sampling."""

    rows: list[int]  # indices into scheduled.sample_seqs
    bitmask: (
        Any  # torch.Tensor [len(rows), ceil(vocab_size / 32)] int32: bit j of word w = token 32w+j
    )
    stats: StructuredOutputStats

    def apply_(self, logits: Any) -> None:
        from pagedgen.worker.token_bitmask import apply_token_bitmask_

        start = time.perf_counter()
        apply_token_bitmask_(logits, self.bitmask, self.rows)
        self.stats.bitmask_apply_time_s += time.perf_counter() - start


class GrammarState(NamedTuple):
    is_terminated: bool  # the constraint is complete: the sequence stops
    error: str | None  # the constraint cannot go on: the sequence fails


class RequestGrammars:
    """A request's compiled constraint, and a grammar per sequence, made on first use: a copy of
    the live grammar sharing the longest prefix of its outputs (a fork's parent), else of the
    compiled one."""

    def __init__(self, compiled: Matcher, gate: ReasoningGate | None = None) -> None:
        self.compiled = compiled
        self.gate = gate
        self.grammars: dict[int, tuple[Sequence, SequenceGrammar]] = {}

    def grammar_of(self, seq: Sequence) -> SequenceGrammar | None:
        """The sequence's grammar, in step with its output; None while it reasons (gate)."""
        start = 0 if self.gate is None else self.gate.content_start(seq)
        if start is None:
            return None
        output_token_ids = seq.output_token_ids[start:]
        entry = self.grammars.get(seq.seq_id)
        if entry is None:
            grammar = self._fork_for(output_token_ids)
            self.grammars = {i: e for i, e in self.grammars.items() if not e[0].is_finished}
            self.grammars[seq.seq_id] = (seq, grammar)
        else:
            grammar = entry[1]
        grammar.sync(output_token_ids)
        return grammar

    def _fork_for(self, output_token_ids: list[int]) -> SequenceGrammar:
        donor, num_shared = None, -1
        for _, grammar in self.grammars.values():
            n = common_prefix_len(grammar.token_ids, output_token_ids)
            if grammar.error is None and n > num_shared:
                donor, num_shared = grammar, n
        return donor.fork() if donor is not None else SequenceGrammar(self.compiled.deep_copy())


class StructuredOutputManager:
    """Compiles constraints on a worker thread, each distinct one once (an LRU cache of
    MAX_CACHED_GRAMMARS), keeps the grammars of the requests that use them, and builds each
    step's bitmask for exactly the sampled rows.

    A request waits for its grammar outside the scheduler (the engine admits it from
    pop_ready()), so compiling never holds up the requests that are decoding.
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: set[int],
        reasoning: str | None = None,  # a reasoning parser: constraints hold after the reasoning
    ) -> None:
        self.tokenizer = tokenizer
        # the reasoning's opening and closing markers' token ids (reasoning_gate.py)
        self.reasoning = reasoning_markers(tokenizer, reasoning) if reasoning else None
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.backend: Any = None  # GuidanceBackend, built by the first compile
        self.stats = StructuredOutputStats()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagedgen-grammar")
        self._compiled: OrderedDict[tuple[str, str], Future[Matcher]] = OrderedDict()
        self._pending: dict[str, Future[Matcher]] = {}  # request id -> compile, in arrival order
        self._requests: dict[str, RequestGrammars] = {}

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def add_request(self, request_id: str, params: StructuredOutputsParams) -> str | None:
        """Starts compiling the request's constraint, or returns why it cannot run."""
        if self.tokenizer is None:
            return "structured output needs the model's tokenizer"
        if not is_backend_installed():
            return INSTALL_HINT
        key = params.key
        future = self._compiled.get(key)
        if future is None:
            future = self._executor.submit(self._compile, params)
            self._compiled[key] = future
            if len(self._compiled) > MAX_CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(key)
            self.stats.num_compile_cache_hits += 1
        self._pending[request_id] = future
        return None

    def pop_ready(self, block: bool) -> list[tuple[str, str | None]]:
        """The requests whose compile has ended, in arrival order, each with its error (None:
        ready to run). block: wait until at least one has ended."""
        if block and self._pending:
            wait(self._pending.values(), return_when=FIRST_COMPLETED)
        ready = []
        for request_id, future in list(self._pending.items()):
            if not future.done():
                continue
            del self._pending[request_id]
            error = future.exception()
            if error is None:
                gate = None if self.reasoning is None else ReasoningGate(self.reasoning)
                self._requests[request_id] = RequestGrammars(future.result(), gate)
            ready.append((request_id, None if error is None else str(error)))
        return ready

    def grammar_bitmask(self, seqs: list[Sequence]) -> GrammarBitmask | None:
        """The bitmask of the constrained sequences among seqs, a step's sample_seqs."""
        if not self._requests:
            return None
        rows, grammars = [], []
        for row, seq in enumerate(seqs):
            request = self._requests.get(seq.request_id)
            grammar = None if request is None else request.grammar_of(seq)
            if grammar is not None:
                rows.append(row)
                grammars.append(grammar)
        if not rows:
            return None
        start = time.perf_counter()
        bitmask, empty_rows = self.backend.fill_bitmask([g.matcher for g in grammars])
        empty = set(empty_rows)
        for i, grammar in enumerate(grammars):
            if i in empty or grammar.matcher.is_error():  # a dead end: llguidance allows only eos
                num_tokens = len(grammar.token_ids)
                grammar.fail(f"the grammar allows no next token after {num_tokens} output tokens")
        stats = self.stats
        stats.bitmask_fill_time_s += time.perf_counter() - start
        stats.num_masked_steps += 1
        stats.num_masked_rows += len(rows)
        return GrammarBitmask(rows, bitmask, stats)

    def advance(self, seq: Sequence) -> GrammarState:
        """Feeds the sequence's new output tokens to its grammar."""
        grammar = self._requests[seq.request_id].grammar_of(seq)
        if grammar is None:  # still reasoning: nothing holds it yet
            return GrammarState(False, None)
        return GrammarState(grammar.is_terminated, grammar.error)

    def free(self, request_id: str) -> None:
        self._pending.pop(request_id, None)
        self._requests.pop(request_id, None)

    def _compile(self, params: StructuredOutputsParams) -> Matcher:
        """On the worker thread: the grammar engine releases the GIL while it compiles."""
        if self.backend is None:
            from pagedgen.engine.structured_output.backend import GuidanceBackend

            start = time.perf_counter()
            self.backend = GuidanceBackend(self.tokenizer, self.vocab_size, self.eos_token_ids)
            self.stats.backend_setup_time_s = time.perf_counter() - start
        start = time.perf_counter()
        compiled = self.backend.compile(params)
        self.stats.compile_time_s += time.perf_counter() - start
        self.stats.num_grammars_compiled += 1
        return compiled
