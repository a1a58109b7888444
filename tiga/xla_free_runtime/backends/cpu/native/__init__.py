"""runtime/native: native code the runtime loads and runs: `jit` (LLVM text -> a shared
library or MCJIT object, called through ctypes) and `pool` (the worker threads that wait in
native code and run the chunk loops of compiled kernels)."""
