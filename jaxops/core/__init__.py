"""CANN metadata (dtypes, formats, tensor descs, impl modes), the op registry and DynArray."""

__all__: list[str] = []
