"""The Yjs codec: lib0, the update format and its causal admission, the engines
and their worker pools, y-protocols and awareness."""
