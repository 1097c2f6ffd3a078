"""Where a table lives (private): routers, placements and their frames, the load policy's
check, and ``run_batch``, the one call every batched operation runs through. Imports only
the folders below it."""
