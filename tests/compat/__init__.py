"""Clients of earlier releases, kept as they shipped, to test that a new
server still serves them (issue 15: additive protocol changes)."""
