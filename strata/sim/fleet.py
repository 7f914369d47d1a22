"""The fleet: services' pods on a shared GPU budget, their life (pending, starting, ready,
draining), the requests routed to them, and the Kubernetes behaviour in between: a scale-in
drains the newest pod (a StatefulSet removes its highest ordinal), a pod holds its GPUs from
scheduling until it has drained, priority preemption evicts lower tiers' pods (their requests go
back through the router), requests wait at the router while no replica is ready or every
replica's slots are taken (``strata.sim.gate``), and a service scaled to zero is woken by its
first request where the policy's activator does that (the built-in autoscaler wakes it from its
own loop, on the count of requests its routers hold).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from strata.sim.placement import Holds, Want, place
from strata.sim.requests import Seq
from strata.sim.router import Router
from strata.sim.service import HOLDING, Pod, PodState, Sample, Scaling, Service
from strata.sim.trace import Request

Timer = Callable[[float, Callable[[float], None]], None]
PUMP_S = 1.0  # how often the router's waiting requests look for a free slot between events


class Fleet:
    def __init__(self, services: Sequence[Service], gpus: int, router: Router, timer: Timer) -> None:
        self.services = list(services)
        self.gpus = gpus
        self.router = router
        self.timer = timer  # timer(at, callback): call back at a simulated time
        self.now = 0.0

    # ---- time ----

    def advance(self, until: float) -> None:
        for service in self.services:
            for pod in service.in_state(PodState.READY, PodState.DRAINING):
                assert pod.engine is not None
                pod.engine.advance(until)
        self.now = until
        if self._reap(until):
            self.reconcile(until)
        for service in self.services:
            if service.gate:
                self.pump(service, until)

    def _reap(self, now: float) -> bool:
        """Drained pods let go of their GPUs."""
        done = False
        for service in self.services:
            for pod in service.in_state(PodState.DRAINING):
                assert pod.engine is not None
                if not pod.engine.busy:
                    self._release(service, pod, min(now, pod.engine.clock))
                    done = True
        return done

    def finish(self, end: float) -> None:
        """Account every pod still holding GPUs at the end of the run."""
        for service in self.services:
            for pod in service.in_state(*HOLDING):
                service.replica_seconds += end - pod.started_s

    # ---- requests ----

    def arrive(self, service: Service, request: Request, now: float) -> None:
        self.dispatch(service, service.seq(request, now), now)

    def dispatch(self, service: Service, seq: Seq, now: float) -> None:
        """Through the router: to a replica with a free slot, else into the router's wait."""
        ready = service.in_state(PodState.READY)
        free = self._free(service, ready)
        if free and not service.gate:
            self._route(seq, free, now)
            return
        refused = service.gate.admit(seq, held=not ready, now=now)
        if refused is not None:
            service.outcomes.add(seq, refused, now)
        elif len(service.gate) == 1:
            self.timer(now + PUMP_S, lambda t: self._pump_tick(service, t))
        if not ready and service.desired == 0 and service.wakes_on_arrival:
            self.scale(service, 1, now, "a request arrived while scaled to zero")

    def pump(self, service: Service, now: float) -> None:
        """The router's waiting requests: the expired ones refused, the next ones to free slots."""
        for seq, reason in service.gate.expire(now):
            service.outcomes.add(seq, reason, now)
        free = self._free(service)
        while service.gate and free:
            self._route(service.gate.pop(), free, now)
            free = self._free(service, free)

    def _pump_tick(self, service: Service, now: float) -> None:
        if service.gate:  # the fleet advanced to now just before: pumped already; keep ticking
            self.timer(now + PUMP_S, lambda t: self._pump_tick(service, t))

    def _free(self, service: Service, pods: Sequence[Pod] | None = None) -> list[Pod]:
        candidates = service.in_state(PodState.READY) if pods is None else pods
        slots = service.gate.limits.slots
        return [p for p in candidates if p.engine is not None and p.engine.in_flight < slots]

    def _route(self, seq: Seq, free: Sequence[Pod], now: float) -> None:
        engine = self.router.pick(seq, free, now).engine
        assert engine is not None
        engine.submit(seq, now)

    # ---- replicas ----

    def scale(self, service: Service, replicas: int, now: float, reason: str) -> None:
        if replicas == service.desired:
            return
        service.scalings.append(Scaling(now, service.desired, replicas, reason))
        service.desired = replicas
        self.reconcile(now)

    def reconcile(self, now: float) -> None:
        for service in self.services:
            self._match_desired(service, now)
        self._place(now)

    def _match_desired(self, service: Service, now: float) -> None:
        live = service.in_state(PodState.PENDING, PodState.STARTING, PodState.READY)
        for _ in range(service.desired - len(live)):
            service.new_pod(now)
        surplus = len(live) - service.desired
        by_cost = sorted(live, key=lambda p: (_REMOVAL_ORDER[p.state], -p.ordinal))
        for pod in by_cost[: max(0, surplus)]:
            self._remove(service, pod, now)

    def _remove(self, service: Service, pod: Pod, now: float) -> None:
        if pod.state is PodState.PENDING:
            service.pods.remove(pod)
        elif pod.state is PodState.STARTING:
            self._release(service, pod, now)
        else:
            pod.state = PodState.DRAINING

    def _release(self, service: Service, pod: Pod, now: float) -> None:
        service.replica_seconds += now - pod.started_s
        service.pods.remove(pod)

    def _place(self, now: float) -> None:
        wants = {p.name: (s, p) for s in self.services for p in s.in_state(PodState.PENDING)}
        holds = {p.name: (s, p) for s in self.services for p in s.in_state(*HOLDING)}
        decision = place(
            [
                Want(name, s.priority, s.config.gpus_per_replica, p.created_s)
                for name, (s, p) in wants.items()
            ],
            [
                Holds(n, s.priority, s.config.gpus_per_replica, p.started_s, p.ordinal)
                for n, (s, p) in holds.items()
            ],
            self.gpus,
        )
        for name in decision.evict:
            self._preempt(*holds[name], now)
        for name in decision.start:
            self._start(*wants[name], now)

    def warm_start(self, now: float) -> None:
        """The replicas a service runs with when the replay begins are already serving."""
        self.reconcile(now)
        for service in self.services:
            for pod in service.in_state(PodState.STARTING):
                self._ready(service, pod, now)

    def _start(self, service: Service, pod: Pod, now: float) -> None:
        pod.state, pod.started_s = PodState.STARTING, now
        self.timer(now + service.profile.startup_s, lambda t: self._ready(service, pod, t))

    def _ready(self, service: Service, pod: Pod, now: float) -> None:
        if pod.state is not PodState.STARTING or pod not in service.pods:
            return  # removed or preempted while starting
        pod.state, pod.ready_s = PodState.READY, now
        pod.engine = service.new_engine(now)
        self.pump(service, now)

    def _preempt(self, service: Service, pod: Pod, now: float) -> None:
        """Evicted for a higher tier's pod: its requests go back through the router, and its
        controller asks for a replacement (pending until GPUs free up)."""
        seqs = pod.engine.drain() if pod.engine is not None else []
        self._release(service, pod, now)
        service.pod_preemptions += 1
        if pod.state is not PodState.DRAINING:
            service.new_pod(now)
        for seq in seqs:
            seq.retries += 1
            service.retried += 1
            self.dispatch(service, seq, now)

    # ---- what the report plots ----

    def sample(self, now: float) -> None:
        for service in self.services:
            ready = len(service.in_state(PodState.READY))
            holding = len(service.in_state(*HOLDING))
            service.samples.append(Sample(now, service.desired, ready, holding))


# Scale-in removes what costs least to lose: pods not yet started, then starting, then serving.
_REMOVAL_ORDER = {PodState.PENDING: 0, PodState.STARTING: 1, PodState.READY: 2}
