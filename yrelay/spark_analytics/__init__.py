"""Spark jobs over the event log and Redis: lag, statuses, latency, a dashboard.

Importing this package does not import pyspark; the modules that need it do.
"""
