"""What the planes share: the facts and the wire formats that the operator, the router and the
worker must agree on, each defined once here.

- ``tiers``: the KV cache tiers' names, fastest first.
- ``blocks``: the KV block's default size and the page its slots are aligned to.
- ``endpoints``: the ports and HTTP paths the planes reach each other on.
- ``apigroup``: the Strata API's group and version.
- ``hold``: how many requests, and how long, a router holds while its service has no replica,
  and the gauge the autoscaler reads them by.
- ``routermemory``: the memory a router needs for the block keys it follows.
- ``kvbudget``, ``sketchsize``: the memory a KV-tier sidecar needs for what its tiers index.
- ``logs``: the JSON log lines, and the request id that joins one request's lines.
- ``openai``: the OpenAI-compatible API the worker serves and the router fronts.

Torch-free, and free of any plane: the operator, the router and the worker import this package,
and it imports none of them.
"""
