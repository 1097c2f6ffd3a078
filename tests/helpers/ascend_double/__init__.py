"""A test double of the CANN runtime (C sources) and the helper that builds it."""
