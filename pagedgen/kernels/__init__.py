"""Our kernels, one thin wrapper each: CUDA ones compiled at run time by CuPy, and a C one for the
CPU (pagedgen.kernels.cpu) compiled on first use by the machine's C compiler.

Only pagedgen.kernels.loader imports cupy, and only when a kernel is launched; planning a launch
(shape checks, instantiation, grid) needs torch alone, which lets the tests run the same launch
plans through a CPU emulation of the kernels.
"""
