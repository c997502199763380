"""Counts (not timings) behind issue 6's proofs, on the real SmolLM2-135M-Instruct:

    python benchmarks/kv_memory_report.py [prefix] [parallel] [beam] [pool]

prefix caching with a shared system prompt; n=8 parallel sampling against 8 separate requests;
beam search against beam_width independent sequences; a pool a tenth of the workload's need.
"""

import random
import sys

from pagedgen import LLM, BeamSearchParams, SamplingParams

SYSTEM = (
    "You are a meticulous assistant for a travel agency. Answer in at most three sentences, "
    "cite the relevant rule number, never invent prices, and always end by asking whether the "
    "customer needs anything else. Rules: 1. Refunds within 24 hours are free. 2. Changes cost "
    "a fee that depends on the fare class. 3. Pets travel in the cabin under 8 kg. 4. Infants "
    "under two fly on a lap. 5. Luggage over 23 kg pays a surcharge. 6. Seat selection is free "
    "for members. 7. Lounges open three hours before departure."
)
QUESTIONS = [
    "Can I bring my cat?",
    "How much does a change cost?",
    "My bag weighs 25 kg, what happens?",
    "Do babies need a seat?",
    "When does the lounge open?",
    "I booked an hour ago and want my money back.",
    "Is seat selection free?",
    "What is rule 4?",
    "Can I change my flight for free?",
    "Do members pay for seats?",
    "Can my dog of 12 kg fly with me?",
    "Tell me about refunds.",
    "What are the luggage rules?",
    "Is there a lounge?",
    "How early should I arrive for the lounge?",
    "Can an infant sit on my lap?",
]


def llm(**kwargs) -> LLM:
    return LLM(log=lambda m: None, **kwargs)


def peak_blocks(engine) -> int:
    return round(engine.stats.peak_kv_cache_usage_perc * engine.num_blocks)


def prefix_caching() -> None:
    greedy = SamplingParams(temperature=0, max_tokens=32)
    results = {}
    for caching in (True, False):
        engine_llm = llm(kv_cache_memory=0.5, enable_prefix_caching=caching)
        convs = [
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
            for q in QUESTIONS
        ]
        outputs = engine_llm.chat(convs, greedy)
        results[caching] = ([o.outputs[0].token_ids for o in outputs], engine_llm.engine.stats)
    (on_ids, on), (off_ids, off) = results[True], results[False]
    prompt_tokens = sum(len(engine_llm.apply_chat_template(c)) for c in convs)
    print("## prefix caching: 16 chats sharing a system prompt, 32 greedy tokens each")
    print(f"prompt tokens in the requests: {prompt_tokens}")
    print(f"prefill tokens computed, caching on:  {on.num_prompt_tokens}")
    print(f"prefill tokens computed, caching off: {off.num_prompt_tokens}")
    print(f"prefix_cache_hit_rate: {on.prefix_cache_hit_rate:.1%}")
    print(f"greedy outputs identical: {on_ids == off_ids}\n")


def parallel_sampling() -> None:
    prompt = SYSTEM + " Write a short poem about the moon."
    sampled = dict(temperature=0.9, max_tokens=96, ignore_eos=True)
    grouped = llm(kv_cache_memory=0.5)
    (out,) = grouped.generate([prompt], SamplingParams(n=8, seed=11, **sampled))
    apart = llm(kv_cache_memory=0.5, enable_prefix_caching=False)
    seps = apart.generate([prompt] * 8, [SamplingParams(seed=11 + i, **sampled) for i in range(8)])
    same = [c.token_ids for c in out.outputs] == [s.outputs[0].token_ids for s in seps]
    num_prompt = len(grouped.tokenizer.encode(prompt))
    print(f"## parallel sampling: n=8 vs 8 separate requests ({num_prompt}-token prompt, 96 out)")
    print(f"peak KV blocks, n=8 sharing the prompt:  {peak_blocks(grouped.engine)}")
    print(f"peak KV blocks, 8 separate requests:     {peak_blocks(apart.engine)}")
    print(f"seeded outputs identical to separate requests with seeds 11..18: {same}\n")


def beam_search() -> None:
    engine_llm = llm(kv_cache_memory=0.5)
    engine = engine_llm.engine
    width, max_tokens = 4, 64
    prompt = engine_llm.tokenizer.encode(SYSTEM)
    engine.add_request("b", prompt, BeamSearchParams(beam_width=width, max_tokens=max_tokens))
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, engine.block_manager.num_used_blocks)
    independent = width * engine.block_manager.num_blocks_for(len(prompt) + max_tokens)
    print(f"## beam search: width {width}, {len(prompt)}-token prompt, {max_tokens} tokens")
    print(f"peak KV blocks shared by the beams: {peak}")
    print(f"{width} independent sequences would hold: {independent}\n")


def tenth_of_the_pool() -> None:
    rng = random.Random(0)
    tokenizer = llm(kv_cache_memory=0.01).tokenizer
    prompts = [tokenizer.encode(f"{q} {rng.random()}") for q in QUESTIONS * 2]
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    need = sum(-(-(len(p) + 64) // 16) for p in prompts)
    reference = llm(kv_cache_memory=0.5).generate(prompts, params)
    print(f"## a pool a tenth of the need: {len(prompts)} requests need {need} blocks of 16")
    for mode in ("swap", "recompute"):
        memory = (need // 10) * 16 * 46080 / 2**30
        small = llm(kv_cache_memory=memory, preemption_mode=mode, swap_space=0.1)
        outputs = small.generate(prompts, params)
        same = [o.outputs[0].token_ids for o in outputs] == [
            o.outputs[0].token_ids for o in reference
        ]
        s = small.engine.stats
        print(
            f"{mode:9s}: {small.engine.num_blocks} blocks, "
            f"preemptions {s.num_preemptions_by_mode}, "
            f"blocks swapped out/in {s.num_blocks_swapped_out}/{s.num_blocks_swapped_in}, "
            f"greedy identical to an unconstrained run: {same}"
        )


SECTIONS = {
    "prefix": prefix_caching,
    "parallel": parallel_sampling,
    "beam": beam_search,
    "pool": tenth_of_the_pool,
}

if __name__ == "__main__":
    for name in sys.argv[1:] or SECTIONS:
        SECTIONS[name]()
