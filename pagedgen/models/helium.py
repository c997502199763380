from pagedgen.models.glm import GlmForCausalLM


class HeliumForCausalLM(GlmForCausalLM):
    """Kyutai's Helium (helium-1-preview-2b, Helium-1-2B): the Llama decoder with rotary
    embeddings in interleaved pairs over the whole head, handled as GLM's are (q and k rows
    reordered as they load), q/k/v biased where attention_bias but o never, and the MLP biased
    where mlp_bias."""
