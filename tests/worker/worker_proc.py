"""A real ``strata worker serve`` process on a loopback port, as the operator runs it, for tests
that talk to it with the clients users use (the official ``openai`` client). The helpers live in
``strata.stack.dataplane`` (the routing benchmark uses them too)."""

from strata.stack.dataplane import READY_WITHIN_S, WorkerProcess, running_worker, wait_ok
from strata.stack.wait import free_port

__all__ = ["READY_WITHIN_S", "WorkerProcess", "free_port", "running_worker", "wait_ok"]
