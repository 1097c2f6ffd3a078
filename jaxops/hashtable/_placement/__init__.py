"""Private."""
