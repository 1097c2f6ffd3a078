"""The bottom layer of the wing (private; the public names are :mod:`jaxops.hashtable`'s): the
``HashTable`` pytree of one shard, its 64-bit words, CANN's hash, argument checks, and the
table's slots moved to the host in chunks. Imports nothing else of the wing."""
