"""The kernel sources (CUDA, and C for the CPU) live in the top-level kernels/ folder and ship
inside the wheel as the data-only package pagedgen._kernels, where pagedgen.kernels.source finds
them."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["pagedgen", "pagedgen.*"]) + ["pagedgen._kernels"],
    package_dir={"pagedgen._kernels": "kernels"},
    package_data={"pagedgen._kernels": ["*.cu", "*.cuh", "*.c", "*.h"]},
)
