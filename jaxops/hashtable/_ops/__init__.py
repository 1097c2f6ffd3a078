"""The table operations (private; exported by :mod:`jaxops.hashtable`): each checks its
arguments and runs one shard's function on the table's placement. Imports only the folders
below it; the public subpackages and the face import it."""
