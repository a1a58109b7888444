"""runtime/backends/triton: the Triton backend: compile, cache and launch rendered Triton
kernels (on CUDA, or in Triton's interpreter with the stand-in device runtime)."""
