"""runtime caches: the artifact cache (compiled kernels on disk and in memory), the
executable cache, and the weak per-equation, per-program and per-relation caches
of what the runtime derives from them."""
