"""What one shard does in each operation (private): the CANN OpDefs, and per operation its
shard function (input distribution, local kernel, output distribution, given a router) and
its kernel (a jitted function of one ``HashTable``, the OpDef's xla kernel for a CANN
operator). Imports only ``_table`` and ``_walks``: the router is an argument."""
