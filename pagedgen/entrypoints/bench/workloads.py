from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from pagedgen.entrypoints.chat_template import apply_chat_template
from pagedgen.entrypoints.io.sharegpt import iter_sharegpt_records

MAX_SHAREGPT_PROMPT_TOKENS = 512
MAX_SHAREGPT_OUTPUT_TOKENS = 128


@dataclass(slots=True)
class Workload:
    """The requests every engine of a benchmark runs: prompts as token ids, each with its own
    max_tokens (greedy, ignore_eos), in arrival order."""

    name: str
    prompts: list[list[int]]
    max_tokens: list[int]
    prompt_format: str

    def __post_init__(self) -> None:
        assert len(self.prompts) == len(self.max_tokens) > 0
        assert all(self.prompts) and min(self.max_tokens) >= 1

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def num_output_tokens(self) -> int:
        return sum(self.max_tokens)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "num_requests": self.num_requests,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "max_prompt_len": max(len(p) for p in self.prompts),
            "max_output_len": max(self.max_tokens),
            "prompt_format": self.prompt_format,
        }


def sharegpt_workload(tokenizer: PreTrainedTokenizerBase, num_prompts: int) -> Workload:
    """The first num_prompts conversations whose first human turn, as a chat message through the
    tokenizer's chat template (raw text when it has none), is at most 512 tokens and is followed
    by a gpt turn; max_tokens is that reference answer's token length, capped to 1..128."""
    use_template = bool(tokenizer.chat_template)
    prompts: list[list[int]] = []
    max_tokens: list[int] = []
    for record in iter_sharegpt_records():
        turns = record.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human" or turns[1].get("from") != "gpt":
            continue
        prompt = encode_prompt(tokenizer, turns[0]["value"], use_template)
        if not prompt or len(prompt) > MAX_SHAREGPT_PROMPT_TOKENS:
            continue
        num_reference = len(tokenizer.encode(turns[1]["value"], add_special_tokens=False))
        prompts.append(prompt)
        max_tokens.append(min(max(num_reference, 1), MAX_SHAREGPT_OUTPUT_TOKENS))
        if len(prompts) == num_prompts:
            break
    if len(prompts) < num_prompts:
        raise ValueError(f"ShareGPT holds only {len(prompts)} usable prompts, {num_prompts} asked")
    prompt_format = "chat template" if use_template else "raw text"
    return Workload(f"sharegpt-{num_prompts}", prompts, max_tokens, prompt_format)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str, use_template: bool) -> list[int]:
    if use_template:
        return apply_chat_template(tokenizer, [{"role": "user", "content": text}])
    return tokenizer.encode(text)


def random_workload(
    tokenizer: PreTrainedTokenizerBase,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int = 0,
    name: str = "fixed",
) -> Workload:
    """num_prompts prompts of input_len random non-special token ids, output_len tokens each."""
    if input_len < 1 or output_len < 1:
        raise ValueError(f"input_len and output_len must be >= 1, got {input_len}, {output_len}")
    special = set(tokenizer.all_special_ids)
    allowed = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(allowed), (num_prompts, input_len), generator=generator)
    prompts = allowed[picks].tolist()
    return Workload(
        f"{name}-{input_len}in-{output_len}out",
        prompts,
        [output_len] * num_prompts,
        "random token ids",
    )
