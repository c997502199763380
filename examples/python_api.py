"""pagedgen as a library: batch generation from Python, greedy and sampled, scoring, and a
chat turn continued over an 8-bit KV cache.

python examples/python_api.py
"""

import math

from pagedgen import LLM, SamplingParams

llm = LLM()  # HuggingFaceTB/SmolLM2-135M-Instruct by default

prompts = ["The capital of France is", "The three primary colors are"]
for output in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32)):
    print(f"{output.prompt!r} -> {output.outputs[0].text!r}")

conversations = [
    [{"role": "user", "content": "Write a haiku about autumn."}],
    [{"role": "user", "content": "Name a fruit that is yellow."}],
]
sampled = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=64, seed=1234)
for output in llm.chat(conversations, sampled):
    completion = output.outputs[0]
    print(f"[{completion.finish_reason}, {len(completion.token_ids)} tokens] {completion.text}")

# Scoring: each prompt token's log-probability given the ones before it (None for the first).
sentences = ["Paris is the capital of France.", "Paris is the capital of Peru."]
scored = llm.generate(sentences, SamplingParams(max_tokens=1, prompt_logprobs=0))
for output in scored:
    steps = zip(output.prompt_token_ids[1:], output.prompt_logprobs[1:])
    total = sum(logprobs[token].logprob for token, logprobs in steps)
    perplexity = math.exp(-total / (len(output.prompt_token_ids) - 1))
    print(f"{output.prompt!r}: log-probability {total:.2f}, perplexity {perplexity:.1f}")

# An assistant turn left open for the model to go on (vLLM's continue_final_message), and
# K/V stored as 8-bit floats: 4x the tokens of a float32 cache in the same memory.
compact = LLM(kv_cache_dtype="fp8")
started = [
    {"role": "user", "content": "List three colors."},
    {"role": "assistant", "content": "Sure: red,"},
]
greedy = SamplingParams(temperature=0, max_tokens=16)
continued = compact.chat(started, greedy, add_generation_prompt=False, continue_final_message=True)
print(f"fp8 KV cache: 'Sure: red,' + {continued[0].outputs[0].text!r}")
