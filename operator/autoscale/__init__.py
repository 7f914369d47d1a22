"""The built-in autoscaler: scrape the workers, aggregate signals, decide, scale.

``metrics`` parses one worker's exposition, ``signals`` aggregates pods between two scrapes,
``decide`` is the pure HPA-style decision, ``peering`` says whether this replica is active and
``loop`` is the thin async glue the operator starts. Nothing here imports torch or the worker."""
