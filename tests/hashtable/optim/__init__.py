"""Tests of jaxops/hashtable/optim: the row optimizers and whose state a slot holds."""
