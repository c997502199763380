from transformers import PreTrainedTokenizerBase

Messages = list[dict[str, str]]


def apply_chat_template(tokenizer: PreTrainedTokenizerBase, messages: Messages) -> list[int]:
    """The prompt token ids for a conversation, ready for the assistant's turn."""
    if not tokenizer.chat_template:
        raise ValueError("this model's tokenizer has no chat template; give plain prompts")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)
