from pagedgen.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 and Phi-4-mini: the Llama decoder with q/k/v and gate/up fused in the checkpoint
    as ours are (they load whole), and a partial rotary embedding on Phi-4-mini (RotaryEmbedding
    reads the factor). The 128k models' LongRoPE takes its short factors at every position,
    which transformers does up to original_max_position_embeddings tokens (it switches the whole
    sequence to the long ones past that, vLLM every token of a batch that holds such a
    position)."""
