"""vLLM's reasoning parsers for chat completions: a reasoning model's answer split into its
reasoning (between <think> and </think>) and its content (after </think>). The chat template
may open <think> in the prompt, so the output need not hold it.

  deepseek_r1    no </think>: the model was still reasoning when it stopped, all reasoning
  qwen3          no </think>: it did not reason (enable_thinking false), all content
  openai_gptoss  gpt-oss's harmony channels instead (io/harmony.py): analysis the reasoning,
                 final the content
"""

from pagedgen.config import REASONING_PARSERS
from pagedgen.entrypoints.io.harmony import split_harmony

START, END = "<think>", "</think>"


def split_reasoning(parser: str, text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) of a completion's text; an empty part is None."""
    if parser not in REASONING_PARSERS:
        raise ValueError(f"reasoning parser must be one of {REASONING_PARSERS}, got {parser!r}")
    if parser == "openai_gptoss":
        return split_harmony(text)
    before, start, after = text.partition(START)
    text = after if start else before
    if END not in text:
        return (text or None, None) if parser == "deepseek_r1" else (None, text or None)
    reasoning, _, content = text.partition(END)
    return reasoning or None, content or None
