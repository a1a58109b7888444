"""runtime/backends: the compiled backends the executor launches on: cpu (LLVM kernels on
the native pool) and triton (Triton kernels on a GPU or in the interpreter)."""
