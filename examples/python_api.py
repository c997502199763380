"""pagedgen as a library: batch generation from Python, greedy and sampled.

python examples/python_api.py
"""

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
