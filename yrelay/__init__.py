"""yrelay: reliable-delivery backend for Yjs CRDT sync over Redis streams."""

__version__ = "0.1.0"
