"""Hash tables sharded by key over a mesh axis; the public API is :mod:`jaxops.hashtable`."""
