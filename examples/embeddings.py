"""Embeddings with vLLM's pooling runner: rank documents against a query by cosine similarity.

python examples/embeddings.py [MODEL]

MODEL is an embedding model's folder (Qwen3-Embedding, e5-mistral, gte-Qwen2, ...); without
one, the default chat model stands in, its last token's hidden state pooled: the API is the
same, the ranking only as good as a model not trained for it makes it.
"""

import sys

import torch

from pagedgen import LLM, PoolingParams

llm = LLM(*sys.argv[1:2], runner="pooling")
print(f"pooling: {llm.engine.pooler_config}")

query = "How do I keep bread fresh?"
documents = [
    "Store bread in a paper bag at room temperature, or freeze slices for longer.",
    "The Eiffel Tower was completed in 1889 for the World's Fair.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
]
outputs = llm.embed([query, *documents])
vectors = torch.tensor([output.outputs.embedding for output in outputs])  # unit length
scores = vectors[1:] @ vectors[0]
for score, document in sorted(zip(scores.tolist(), documents), reverse=True):
    print(f"{score:+.3f}  {document}")

# The raw pooled state, not normalized, and each prompt's cost in tokens.
raw = llm.embed(query, PoolingParams(use_activation=False))[0]
print(
    f"{raw.num_prompt_tokens} tokens -> {raw.outputs.hidden_size} values, "
    f"norm {torch.tensor(raw.outputs.embedding).norm():.2f}"
)
