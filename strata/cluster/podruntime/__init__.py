"""The local pod runtime: runs the pods of nodes labelled ``strata.dev/pod-runtime=local`` as
real processes on this machine (see docs/cluster.md, "Local pod runtime")."""
