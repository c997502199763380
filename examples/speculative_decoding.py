"""Speculative decoding by n-gram prompt lookup: the same greedy text, in fewer steps, when the
completion quotes its prompt.

python examples/speculative_decoding.py
"""

import time

from pagedgen import LLM, SamplingParams

text = (
    "The mitochondria is the powerhouse of the cell. It produces adenosine triphosphate, "
    "the energy currency of the cell, through cellular respiration."
)
conversations = [
    [{"role": "user", "content": f"Repeat this text word for word:\n\n{text}"}],
    [
        {
            "role": "user",
            "content": "Add type hints:\n\ndef area(width, height):\n    return width * height",
        }
    ],
]
params = SamplingParams(temperature=0, max_tokens=96)
spec = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 4,
    # draft only while the batch is small, where a step costs about the same for 1 or 5 tokens
    "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 256, 0]],
}
for name, llm in (("plain", LLM()), ("ngram", LLM(speculative_config=spec))):
    start = time.perf_counter()
    texts = [llm.chat([c], params, use_tqdm=False)[0].outputs[0].text for c in conversations]
    elapsed = time.perf_counter() - start
    stats = llm.engine.stats
    print(f"{name}: {elapsed:.2f} s, {stats.num_steps} steps")
    if name == "ngram":
        s = stats.spec_decode
        print(f"  {s.num_accepted_tokens} of {s.num_draft_tokens} drafts accepted")
    for t in texts:
        print(f"  {t[:70]!r}...")
