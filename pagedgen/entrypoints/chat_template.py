from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from pagedgen.entrypoints.io.tools import template_messages

Messages = list[dict[str, str]]


class ChatTemplate(NamedTuple):
    """How conversations become prompts (vLLM's names): chat_template replaces the tokenizer's
    (Jinja text); chat_template_kwargs are the template's variables every conversation gets
    (enable_thinking for Qwen3, ...), a request's own over them. With apply_to_prompts, a
    plain text prompt is a conversation too: one user message."""

    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] = {}
    apply_to_prompts: bool = False


def apply_chat_template(
    tokenizer: "PreTrainedTokenizerBase",
    messages: Messages,
    template: ChatTemplate = ChatTemplate(),
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | None = None,  # "none" or "auto": how the answer is read (io/tools.py)
) -> list[int]:
    """The prompt token ids for a conversation: ready for the assistant's turn, or with
    continue_final_message, the last (assistant) message left open for the model to go on.
    tools (OpenAI's function definitions) go to the template."""
    if add_generation_prompt and continue_final_message:
        raise ValueError("add_generation_prompt and continue_final_message exclude each other")
    if not (template.chat_template or tokenizer.chat_template):
        raise ValueError("this model's tokenizer has no chat template; give plain prompts")
    text = tokenizer.apply_chat_template(
        template_messages(messages),
        chat_template=template.chat_template,
        tools=tools or None,  # with tool_choice "none" too, as vLLM by default
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        **{**template.chat_template_kwargs, **(chat_template_kwargs or {})},
    )
    return tokenizer.encode(text, add_special_tokens=False)
