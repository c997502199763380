"""Feeding an engine from an iterator of requests in bounded memory, yielding outputs as they
finish; plain Python, no torch."""

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedgen.engine.llm_engine import LLMEngine, Output


def stream_outputs(
    engine: "LLMEngine",
    requests: Iterable[tuple],  # add_request's arguments
    max_pending: int,
    on_step: Callable[["LLMEngine"], None] | None,
) -> Iterator["Output"]:
    """Keeps up to max_pending requests unfinished, pulling the next ones from requests as
    others finish, and steps the engine until all are done (LLMEngine.stream)."""
    requests = iter(requests)
    exhausted = False
    while True:
        while not exhausted and engine.num_unfinished_requests < max_pending:
            request = next(requests, None)
            if request is None:
                exhausted = True
            else:
                engine.add_request(*request)
        if not engine.has_unfinished_requests():
            engine.finish_in_flight()  # a step of finished sequences only
            return
        finished = engine.step()
        if on_step is not None:
            on_step(engine)
        yield from finished
