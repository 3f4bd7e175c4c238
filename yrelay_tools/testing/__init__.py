"""Reusable test machinery: server processes and the delivery checker."""
