"""The project as a whole: its layers, public surface, command line, README and docs,
examples, benchmark runner."""
