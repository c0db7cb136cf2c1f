"""omlx engine models (see :mod:`kvlab.engines`)."""
