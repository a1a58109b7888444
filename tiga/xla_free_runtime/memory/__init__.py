"""runtime/memory: tg.Tensor, its storage tiers (host, device, disk), scopes, budgets and
the memory report."""
