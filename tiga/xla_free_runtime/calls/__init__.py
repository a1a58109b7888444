"""runtime: what a call is bound to (binding), how each propagate routes (routes), and
the thread pool size it runs with (threads)."""
