"""One shard's walks (private): the probe walks every operation is built from, key batches
and their grouping, the differentiable row gather, which key a slot's optimizer state
belongs to, and the structure check the walks rely on. Imports only ``_table``."""
