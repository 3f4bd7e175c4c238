"""Redis storage: key layout, scripts, reads, the one append, the reader loop."""
