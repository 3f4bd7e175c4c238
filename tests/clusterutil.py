"""The test cluster now lives in yrelay_tools (the chaos suite and the bench
start it too); this name stays for the tests that import it."""

from __future__ import annotations

from yrelay_tools.testing.redis_cluster import LocalCluster, cluster_node, cluster_port, parse_nodes, start_node

__all__ = ["LocalCluster", "cluster_node", "cluster_port", "parse_nodes", "start_node"]
