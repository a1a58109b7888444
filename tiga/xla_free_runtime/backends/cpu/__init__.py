"""runtime/backends/cpu: the cpu-llvm backend: compiled LLVM kernels (generic propagate,
radius/kNN, attention) and the native jit, heap and worker pool they run on."""
