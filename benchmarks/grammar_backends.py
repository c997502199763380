"""llguidance against xgrammar on SmolLM2's tokenizer (49,152 tokens), the figures that chose
pagedgen's grammar engine: tokenizer set-up, compile time per JSON schema, and the time to fill
the next-token bitmask of 64 sequences per decode step.

    pip install xgrammar  # optional: without it only llguidance is measured
    python benchmarks/grammar_backends.py [--threads 1] [--steps 60]

Each of the 64 sequences follows its own valid document under the extraction schema of
tests/structured_workload.py, so the masks are those of a real JSON decode.
"""

import argparse
import copy
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.structured_workload

from pagedgen.loader import DEFAULT_MODEL, resolve_model  # noqa: E402
from tests.structured_workload import EXTRACTION_SCHEMA  # noqa: E402

BATCH = 64
NUM_SCHEMAS = 20
WORDS = ["python", "sorting", "recipe", "tax", "poem", "physics", "loan", "essay", "sql", "cat"]


def schema_variants() -> list[dict]:
    """Distinct schemas (no compile cache can share work between them) of the same size."""
    variants = []
    for i in range(NUM_SCHEMAS):
        schema = copy.deepcopy(EXTRACTION_SCHEMA)
        schema["properties"]["category"]["enum"].append(f"other-{i}")
        variants.append(schema)
    return variants


def documents(rng: random.Random) -> list[str]:
    """BATCH valid documents under the extraction schema, written as both grammars expect."""
    docs = []
    for _ in range(BATCH):
        doc = {
            "topic": " ".join(rng.choices(WORDS, k=rng.randint(2, 5))),
            "category": rng.choice(EXTRACTION_SCHEMA["properties"]["category"]["enum"]),
            "difficulty": rng.randint(1, 5),
            "keywords": rng.sample(WORDS, rng.randint(1, 3)),
            "request": {"language": "english", "needs_code": rng.random() < 0.5},
        }
        docs.append(json.dumps(doc, separators=(", ", ": ")))
    return docs


class Guidance:
    name = "llguidance"

    def __init__(self, tokenizer, vocab_size: int, threads: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.numpy

        self.ll, self.fill = llguidance, llguidance.numpy.fill_next_token_bitmask_par
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self.executor = llguidance.LLExecutor(threads)
        self.vocab_size = vocab_size

    def compile(self, schema: dict):
        options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        grammar = self.ll.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=options)
        matcher = self.ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        matcher.compute_bitmask()
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def matchers(self, compiled, n: int) -> list:
        return [compiled.deep_copy() for _ in range(n)]

    def fill_bitmask(self, matchers: list, bitmask: np.ndarray) -> None:
        self.fill(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def accept(self, matcher, token_id: int) -> None:
        assert matcher.consume_token(token_id), matcher.get_error()


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab_size: int, threads: int) -> None:
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=threads)
        self.batch = xgrammar.BatchGrammarMatcher(max_threads=threads)

    def compile(self, schema: dict):
        return self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(", ", ": ")
        )

    def matchers(self, compiled, n: int) -> list:
        return [self.xgr.GrammarMatcher(compiled) for _ in range(n)]

    def fill_bitmask(self, matchers: list, bitmask: np.ndarray) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def accept(self, matcher, token_id: int) -> None:
        assert matcher.accept_token(token_id)


def measure(backend_class, tokenizer, vocab_size: int, args: argparse.Namespace) -> None:
    start = time.perf_counter()
    backend = backend_class(tokenizer, vocab_size, args.threads)
    setup_s = time.perf_counter() - start
    compile_ms = []
    for schema in schema_variants():
        start = time.perf_counter()
        compiled = backend.compile(schema)
        compile_ms.append(1e3 * (time.perf_counter() - start))
    token_ids = [tokenizer.encode(doc) for doc in documents(random.Random(0))]
    matchers = backend.matchers(compiled, BATCH)
    bitmask = np.zeros((BATCH, (vocab_size + 31) // 32), dtype=np.int32)
    fill_ms = []
    for step in range(min(args.steps, min(map(len, token_ids)))):
        start = time.perf_counter()
        backend.fill_bitmask(matchers, bitmask)
        fill_ms.append(1e3 * (time.perf_counter() - start))
        for row, (matcher, ids) in enumerate(zip(matchers, token_ids, strict=True)):
            assert (int(bitmask[row, ids[step] // 32]) >> (ids[step] % 32)) & 1, (row, step)
            backend.accept(matcher, ids[step])
    print(
        f"{backend.name}: tokenizer set-up {1e3 * setup_s:.0f} ms; compile per schema "
        f"mean {statistics.mean(compile_ms):.2f} ms (first {compile_ms[0]:.2f}, "
        f"max {max(compile_ms):.2f}) over {NUM_SCHEMAS} schemas; bitmask of {BATCH} sequences "
        f"per step: median {statistics.median(fill_ms):.2f} ms, mean "
        f"{statistics.mean(fill_ms):.2f} ms, max {max(fill_ms):.2f} ms over {len(fill_ms)} "
        f"steps ({args.threads} thread(s))"
    )


def main() -> None:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    path = resolve_model(DEFAULT_MODEL).path
    tokenizer = AutoTokenizer.from_pretrained(path)
    vocab_size = json.loads((path / "config.json").read_text())["vocab_size"]
    print(f"{DEFAULT_MODEL}: vocabulary {vocab_size:,}")
    for backend_class in (Guidance, XGrammar):
        try:
            measure(backend_class, tokenizer, vocab_size, args)
        except ImportError as e:
            print(f"{backend_class.name}: not installed ({e})")


if __name__ == "__main__":
    main()
