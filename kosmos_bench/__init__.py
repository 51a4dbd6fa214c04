"""kosmos-bench: self-scheduling persistent comm+GEMM kernels and the tooling that measures them."""
__version__ = "0.1.0"
