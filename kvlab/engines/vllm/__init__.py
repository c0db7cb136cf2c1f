"""vllm engine models (see :mod:`kvlab.engines`)."""
