"""Prompt logprobs (vLLM's SamplingParams.prompt_logprobs): for each prompt token after the first,
its log-probability given the tokens before it and the k likeliest tokens', from the hidden
states a prefill step computes anyway."""

from collections.abc import Callable
from typing import NamedTuple

import torch

from pagedgen.core.logprobs import TokenLogprobs
from pagedgen.core.scheduler_output import SchedulerOutput
from pagedgen.worker.sampler import token_ranks

MAX_ROWS = 1024  # logits at a time: rows x vocab_size float32


class PromptLogprobs(NamedTuple):
    """Scheduled sequence seq_index's entries for prompt tokens first_position, first_position
    + 1, ...: {the token: logprob, then the k likeliest tokens' in descending order}."""

    seq_index: int
    first_position: int
    entries: list[TokenLogprobs]


class _Rows(NamedTuple):
    seq_index: int
    first_position: int
    rows: range  # rows of the step's hidden states
    targets: list[int]  # the prompt token each row predicts
    k: int


def _prompt_rows(scheduled: SchedulerOutput, last_rows: list[int]) -> list[_Rows]:
    """Rows at prompt positions p < len(prompt) - 1 of sequences asking for prompt logprobs: the
    logits of position p give prompt token p + 1's logprob. The last prompt position's are the
    first output's, sampled as usual."""
    found = []
    for i in range(scheduled.num_decode_seqs, len(scheduled.seqs)):  # a decode's is an output's
        seq = scheduled.seqs[i]
        k = seq.sampling_params.prompt_logprobs
        if k is None:
            continue
        start, n = scheduled.num_computed_tokens[i], scheduled.num_new_tokens[i]
        end = min(start + n, seq.num_prompt_tokens - 1)
        if end <= start:
            continue
        first_row = last_rows[i] - n + 1
        targets = seq.prompt_token_ids[start + 1 : end + 1]
        found.append(_Rows(i, start + 1, range(first_row, first_row + end - start), targets, k))
    return found


def compute_prompt_logprobs(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    scheduled: SchedulerOutput,
    last_rows: list[int],
) -> list[PromptLogprobs] | None:
    """The step's prompt logprobs, or None when no scheduled prompt token asks for them. The
    logits are the model's own (no grammar mask, penalties or temperature), as vLLM's."""
    found = _prompt_rows(scheduled, last_rows)
    if not found:
        return None
    rows = [row for item in found for row in item.rows]
    targets = [target for item in found for target in item.targets]
    k = max(item.k for item in found)
    device = hidden.device
    row_index = torch.tensor(rows, dtype=torch.int64, device=device)
    target_ids = torch.tensor(targets, dtype=torch.int64, device=device)
    values, ranks, top_values, top_ids = [], [], [], []
    for begin in range(0, len(rows), MAX_ROWS):
        chunk = slice(begin, begin + MAX_ROWS)
        logprobs = torch.log_softmax(compute_logits(hidden[row_index[chunk]]).float(), dim=-1)
        values.append(logprobs.gather(1, target_ids[chunk, None]).squeeze(1))
        ranks.append(token_ranks(logprobs, values[-1]))
        if k:
            top = logprobs.topk(min(k, logprobs.shape[1]), dim=-1)
            top_values.append(top.values)
            top_ids.append(top.indices)
    value_list, rank_list = torch.cat(values).tolist(), torch.cat(ranks).tolist()
    top_value_list = torch.cat(top_values).tolist() if k else [[]] * len(rows)
    top_id_list = torch.cat(top_ids).tolist() if k else [[]] * len(rows)
    result, at = [], 0
    for item in found:
        entries = []
        for target in item.targets:
            entry = {target: value_list[at]}
            for top_id, value in zip(top_id_list[at][: item.k], top_value_list[at][: item.k]):
                entry.setdefault(top_id, value)
            entries.append(TokenLogprobs(entry, rank_list[at]))
            at += 1
        result.append(PromptLogprobs(item.seq_index, item.first_position, entries))
    return result
