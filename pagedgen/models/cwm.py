from pagedgen.models.llama import LlamaForCausalLM


class CwmForCausalLM(LlamaForCausalLM):
    """Meta's Code World Model (facebook/cwm): the Llama decoder with no attention biases, a
    sliding window on the layers layer_types names (three of four by default) and Llama 3's
    rope scaling; all of which the Llama model reads from the config."""
