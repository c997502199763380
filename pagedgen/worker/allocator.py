"""glibc malloc settings for a process that allocates and frees large activations every step.

By default glibc serves every allocation above its mmap threshold (at most 32 MiB once it has
adapted) with fresh pages from the kernel and unmaps them on free, so each large activation of a
prefill step pays page faults and zeroing on first touch: a 4096 x 1536 SiLU-multiply ran 2.4x
slower that way on these machines. Above, the heap serves them and keeps them for reuse, as
tcmalloc (which vLLM recommends preloading) does. The KV pools, larger than the threshold, stay
mmapped: their pages are touched only as blocks are used.
"""

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 256 << 20
TRIM_THRESHOLD_BYTES = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """Applies the settings once per process; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )


def release_freed_memory() -> bool:
    """Hands the heap's free pages back to the kernel (malloc_trim): once, after loading, whose
    transient copies (a layer quantized, then packed) the settings above would otherwise keep
    resident (a Llama-3.2-1B in int4: 1 GiB). False where the C library is not glibc."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
