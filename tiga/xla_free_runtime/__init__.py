"""runtime: tensors and storage tiers, route selection and execution."""
