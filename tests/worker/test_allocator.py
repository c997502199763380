import platform

import pytest

from pagedgen.worker.allocator import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_settings():
    assert keep_freed_memory()
    assert keep_freed_memory()  # once per process; a second call is a no-op that still says so


def test_a_dropped_llm_is_freed_though_loading_freezes_the_heap(tiny_llama_path):
    """LLMEngine.from_config ends with gc.freeze(), as vLLM's engine core does: what is alive
    then is never collected again. The engine must hold no reference cycle, or a dropped LLM
    (tests, notebooks: several in one process) would keep its KV cache for good."""
    import gc
    import weakref

    from pagedgen import LLM

    llm = LLM(str(tiny_llama_path), log=lambda message: None, kv_cache_memory=0.01)
    engine, runner = weakref.ref(llm.engine), weakref.ref(llm.engine.runner)
    assert gc.get_freeze_count() > 0
    del llm
    gc.collect()
    assert engine() is None and runner() is None
