"""Cluster mode: members in an existing coordination service, a rendezvous-hash owner
per strict segment key, fenced hand-off (see docs/cluster.md)."""
