"""CUDA kernels compiled at run time by CuPy, one thin wrapper per kernel.

Only pagedgen.kernels.loader imports cupy, and only when a kernel is launched; planning a launch
(shape checks, instantiation, grid) needs torch alone, which lets the tests run the same launch
plans through a CPU emulation of the kernels.
"""
