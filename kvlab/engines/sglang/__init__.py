"""sglang engine models (see :mod:`kvlab.engines`)."""
