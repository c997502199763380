import platform

import pytest

from pagedgen.allocator import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_settings():
    assert keep_freed_memory()
    assert keep_freed_memory()  # once per process; a second call is a no-op that still says so
