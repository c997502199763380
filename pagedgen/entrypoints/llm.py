import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import fields, replace
from functools import partial
from typing import Any

from pagedgen.config import EngineConfig
from pagedgen.core.beam_search import BeamSearchParams
from pagedgen.engine.llm_engine import LLMEngine, Params, Prompt, log_to_stderr
from pagedgen.engine.model_setup import build_engine
from pagedgen.entrypoints.chat_template import ChatTemplate, Messages, apply_chat_template
from pagedgen.entrypoints.llm_progress import PromptProgress
from pagedgen.entrypoints.score import score_by_cross_encoder, score_by_embeddings, score_pairs
from pagedgen.loader.generation_config import model_sampling_defaults
from pagedgen.loader.resolve import DEFAULT_MODEL, resolve_model
from pagedgen.lora.request import LoRARequest
from pagedgen.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    RequestOutput,
    ScoringRequestOutput,
)
from pagedgen.pooling import PoolingParams
from pagedgen.sampling_params import SamplingParams

logger = logging.getLogger("pagedgen")

# vLLM's engine arguments that change nothing in pagedgen: LLM() takes them, so that a vLLM
# script runs unchanged, and ignores them. Any other unknown keyword is a TypeError.
IGNORED_VLLM_ARGS = frozenset(
    {
        "disable_log_stats",  # pagedgen logs no periodic stats
        "disable_log_requests",
        "max_seq_len_to_capture",  # graphs follow compilation_config
        "disable_custom_all_reduce",  # one device: no all-reduce
        "distributed_executor_backend",
        "max_parallel_loading_workers",
        "disable_async_output_proc",
        "use_v2_block_manager",
    }
)

# What generate() and the other entry points take: text, token ids, or vLLM's TextPrompt and
# TokensPrompt dicts.
PromptInput = Prompt | Mapping[str, Any]


class LLM:
    """Offline batch generation: `LLM(model).generate(prompts, SamplingParams(...))`.

    Keyword arguments are EngineConfig fields (dtype, block_size, kv_cache_memory,
    max_num_seqs, max_num_batched_tokens, max_model_len, attention_backend, device, seed,
    enable_lora, max_loras, max_lora_rank, max_cpu_loras, speculative_config, kv_cache_dtype,
    quantization, reasoning_parser, generation_config, override_generation_config, runner,
    pooler_config).
    With runner="pooling" (or a checkpoint without an LM head, or a classifier) it pools
    prompts: embed(), classify(), score(). vLLM's arguments that change nothing here
    (IGNORED_VLLM_ARGS: disable_log_stats, max_seq_len_to_capture, ...) are taken and ignored.

    A request that cannot run (an empty prompt, one longer than max_model_len) does not stop
    the others: its output holds the error (finish_reason "error"), and each generate() or
    chat() call that had any logs one warning on the "pagedgen" logger.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        log: Callable[[str], None] = log_to_stderr,
        status: Callable[[str], None] = lambda phase: None,
        **kwargs: Any,
    ) -> None:
        names = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(kwargs) - names - IGNORED_VLLM_ARGS)
        if unknown:
            raise TypeError(f"unknown engine arguments {unknown}; known: {sorted(names)}")
        kwargs = {name: value for name, value in kwargs.items() if name in names}
        config = EngineConfig(model=model, **kwargs)
        self.engine = build_engine(config, log=log, status=status)
        self.tokenizer = self.engine.tokenizer
        # As vLLM's: what a request without SamplingParams runs with (generation_config)
        self.default_sampling_fields = model_sampling_defaults(
            resolve_model(config.model, config.download_dir, config.revision).path,
            config.generation_config,
            config.override_generation_config,
        )
        self.get_default_sampling_params()  # a bad default fails here, not on the first call
        self._log, self._said_defaults = log, False

    def get_tokenizer(self) -> Any:
        """The model's tokenizer (vLLM's accessor; also self.tokenizer)."""
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams() with the model's recommended fields (vLLM's name): what generate()
        and chat() run without sampling_params."""
        return SamplingParams(**self.default_sampling_fields)

    def generate(
        self,
        prompts: PromptInput | Iterable[PromptInput],
        sampling_params: Params | list[Params] | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Completes every prompt (text, token ids, or vLLM's {"prompt": text} and
        {"prompt_token_ids": ids} dicts); returns the outputs in prompt order.
        lora_request: the LoRA adapter of every prompt, or a list of one per prompt (None for
        the base model), on an LLM built with enable_lora=True.
        use_tqdm: vLLM's "Processed prompts" bar on stderr while the call runs (prompts done,
        elapsed time, estimated input and output tokens/s), drawn with rich on an interactive
        terminal only: where stderr is a file or a pipe, nothing is written. False draws none.
        """
        if self.engine.pooler_config is not None:
            task = self.engine.pooler_config.task
            raise ValueError(f"this LLM was built with runner='pooling': use LLM.{task}")
        prompts = _prompt_list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
            if self.default_sampling_fields and not self._said_defaults:
                self._log(
                    "default sampling parameters from the model's generation config: "
                    f"{self.default_sampling_fields} (generation_config='vllm' ignores it)"
                )
                self._said_defaults = True
        outputs = self._run(prompts, sampling_params, lora_request, use_tqdm)
        warn_failed(outputs)
        return outputs

    def embed(
        self,
        prompts: PromptInput | Iterable[PromptInput],
        pooling_params: PoolingParams | list[PoolingParams] | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
        use_tqdm: bool = True,
    ) -> list[EmbeddingRequestOutput]:
        """Each prompt's embedding (vLLM's LLM.embed), in prompt order, on an LLM built with
        runner="pooling": its hidden states pooled as the pooler config says (outputs.embedding,
        float32 values). pooling_params: for every prompt, or a list of one per prompt."""
        return self._pool("embed", prompts, pooling_params, lora_request, use_tqdm)

    def classify(
        self,
        prompts: PromptInput | Iterable[PromptInput],
        pooling_params: PoolingParams | list[PoolingParams] | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
        use_tqdm: bool = True,
    ) -> list[ClassificationRequestOutput]:
        """Each prompt's class scores (vLLM's LLM.classify), in prompt order, from a sequence
        classifier or reward model (*ForSequenceClassification): its score head over the
        pooled last token, softmax (one label: sigmoid) as models/classifier.py says
        (outputs.probs; the raw logits with use_activation=False)."""
        return self._pool("classify", prompts, pooling_params, lora_request, use_tqdm)

    def score(
        self,
        data_1: Prompt | list[Prompt],
        data_2: Prompt | list[Prompt],
        pooling_params: PoolingParams | None = None,
        lora_request: LoRARequest | None = None,
        use_tqdm: bool = True,
    ) -> list[ScoringRequestOutput]:
        """vLLM's LLM.score: a similarity score per pair, pairing data_1's one text with each
        of data_2's or the two lists in order; with an embedding model the cosine of the two
        embeddings, with a one-label classifier (a cross-encoder) its score of the pair as one
        prompt (the tokenizer's text and text_pair)."""
        pairs = score_pairs(data_1, data_2)
        task = self.engine.pooler_config.task if self.engine.pooler_config is not None else None
        options = dict(pooling_params=pooling_params, lora_request=lora_request, use_tqdm=use_tqdm)
        if task == "classify":
            if getattr(self.engine.hf_config, "num_labels", 0) != 1:
                raise ValueError("scoring pairs needs a classifier of one label (num_labels 1)")
            classify = partial(self.classify, **options)
            return score_by_cross_encoder(classify, self.tokenizer, pairs)
        return score_by_embeddings(partial(self.embed, **options), pairs)

    def _pool(
        self,
        task: str,
        prompts: PromptInput | Iterable[PromptInput],
        pooling_params: PoolingParams | list[PoolingParams] | None,
        lora_request: LoRARequest | list[LoRARequest | None] | None,
        use_tqdm: bool,
    ) -> list[Any]:
        pooler_config = self.engine.pooler_config
        if pooler_config is None:
            raise ValueError(f"LLM.{task} needs an LLM built with runner='pooling'")
        if pooler_config.task != task:
            raise ValueError(
                f"this model's pooling task is {pooler_config.task}: use LLM.{pooler_config.task}"
            )
        prompts = _prompt_list(prompts)
        params = _per_prompt(pooling_params or PoolingParams(), prompts, "pooling params")
        params = [replace(p, task=task) for p in params]
        return self._run(prompts, params, lora_request, use_tqdm)

    def _run(
        self,
        prompts: list[Prompt],
        params: Params | list[Params],
        lora_request: LoRARequest | list[LoRARequest | None] | None,
        use_tqdm: bool,
    ) -> list[Any]:
        params = _per_prompt(params, prompts, "sampling params")
        loras = _per_prompt(lora_request, prompts, "LoRA requests")
        for lora in {lora for lora in loras if lora is not None}:  # bad adapters fail first
            self.engine.add_lora(lora)
        requests = (
            (str(i), prompt, p, lora)
            for i, (prompt, p, lora) in enumerate(zip(prompts, params, loras))
        )
        try:
            with PromptProgress(len(prompts), use_tqdm) as progress:
                on_step = progress.on_step if progress.enabled else None
                outputs: dict[str, Any] = {}
                for out in self.stream(requests, on_step=on_step):
                    outputs[out.request_id] = out
                    progress.update(out)
        except BaseException:  # Ctrl-C included: the next call starts from an empty engine
            self.engine.abort_all()
            raise
        return [outputs[str(i)] for i in range(len(prompts))]

    def beam_search(
        self,
        prompts: PromptInput | Iterable[PromptInput],
        params: BeamSearchParams,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Beam search for each prompt; each output holds the beam_width best beams, best first.
        use_tqdm: the progress bar of generate, over prompts."""
        prompts = _prompt_list(prompts)
        return self.generate(prompts, [params] * len(prompts), lora_request, use_tqdm)

    def chat(
        self,
        messages: Messages | list[Messages],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        """Applies the chat template (the tokenizer's, or chat_template's Jinja text) to each
        conversation, then generates (use_tqdm: the progress bar of generate). As vLLM's:
        add_generation_prompt opens the assistant's turn; continue_final_message instead leaves
        the last message open for the model to continue; chat_template_kwargs are the
        template's variables (enable_thinking, ...); tools, OpenAI's function definitions, go
        to the template (reading calls from the answers is pagedgen.entrypoints.io.tools')."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        template = ChatTemplate(chat_template, chat_template_kwargs or {})
        prompts = [
            apply_chat_template(
                self.tokenizer,
                m,
                template,
                add_generation_prompt,
                continue_final_message,
                tools=tools,
            )
            for m in conversations
        ]
        return self.generate(prompts, sampling_params, lora_request, use_tqdm)

    def apply_chat_template(
        self, messages: Messages, template: ChatTemplate = ChatTemplate(), **options: Any
    ) -> list[int]:
        """The prompt ids of a conversation; options: those of chat_template.apply_chat_template
        (add_generation_prompt, continue_final_message, chat_template_kwargs, tools)."""
        return apply_chat_template(self.tokenizer, messages, template, **options)

    def reset_prefix_cache(self) -> bool:
        """Forgets the cached prompt blocks (vLLM's name), so the next prompts are computed
        afresh, as benchmarks need; only while nothing runs. Returns whether it did."""
        return self.engine.block_manager.pool.reset_prefix_cache()

    def stream(
        self,
        requests: Iterable[tuple[str, Prompt, Params] | tuple[str, Prompt, Params, LoRARequest]],
        max_pending: int | None = None,
        on_step: Callable[[LLMEngine], None] | None = None,
    ) -> Iterator[RequestOutput]:
        """Yields each request's output as soon as it finishes.

        Requests are pulled from the iterable only while fewer than max_pending are unfinished
        (default: twice max_num_seqs), so an input of any length streams through in bounded
        memory while the batch stays full. on_step(engine) runs after every step, where the
        engine is consistent: it may read the gauges or abort requests.
        """
        yield from self.engine.stream(requests, max_pending, on_step)


def warn_failed(outputs: list[Any]) -> None:
    """One warning for the requests of a call that could not run, so that a script that never
    reads output.error is still told."""
    failed = [out for out in outputs if out.error is not None]
    if failed:
        logger.warning(
            "%d of %d requests failed (their outputs' error; finish_reason 'error'); "
            "the first, request %s: %s",
            len(failed),
            len(outputs),
            failed[0].request_id,
            failed[0].error,
        )


def _per_prompt(value: Any, prompts: list[Prompt], what: str) -> list[Any]:
    """value for every prompt, or value itself where it is a list of one per prompt."""
    if not isinstance(value, list):
        return [value] * len(prompts)
    if len(value) != len(prompts):
        raise ValueError(f"{len(value)} {what} for {len(prompts)} prompts")
    return value


def _prompt_list(prompts: PromptInput | Iterable[PromptInput]) -> list[Prompt]:
    """One prompt or many, as a list of prompts: text, a list of token ids, or vLLM's prompt
    dicts, TextPrompt {"prompt": text} and TokensPrompt {"prompt_token_ids": ids}."""
    if isinstance(prompts, (str, Mapping)) or (
        isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
    ):
        return [_prompt(prompts)]
    return [_prompt(p) for p in prompts]


def _prompt(prompt: PromptInput) -> Prompt:
    if not isinstance(prompt, Mapping):
        return prompt
    unsupported = sorted(k for k in ("multi_modal_data", "multi_modal_uuids") if prompt.get(k))
    if unsupported:
        raise ValueError(f"pagedgen runs text models: prompts with {unsupported} are not taken")
    if "prompt_token_ids" in prompt:
        return list(prompt["prompt_token_ids"])
    if "prompt" in prompt:
        return prompt["prompt"]
    raise ValueError(
        f"a prompt dict needs 'prompt' (text) or 'prompt_token_ids', got {sorted(prompt)}"
    )
