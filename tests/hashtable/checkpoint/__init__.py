"""Tests of jaxops/hashtable/checkpoint: Orbax checkpoints of train states, restores in a
fresh process, the guard against concurrent and killed saves."""
