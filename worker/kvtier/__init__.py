"""The tiered KV-cache sidecar: warm blocks in shared-memory DRAM, cold blocks on local NVMe,
shareable blocks on a shared filesystem, behind a Unix-socket protocol the engine's
:class:`~strata.worker.kv_connector.KVConnector` client speaks.

Layers import downward only: ``client`` -> ``protocol``, ``arena``, ``blockcopy`` ->
``devicehash`` -> ``xxh3parts`` (the engine's process alone loads Triton); ``server``
-> ``service`` -> (``demoter``, ``sealer``) -> ``movement`` -> (``promotion``, ``writedown``) ->
``tiers`` ->
(``arena``, ``nvme``, ``shared``, ``index``) -> (``policy``, ``admission``). ``policy``,
``admission``, ``index`` and ``simulate`` are pure and tensor-free, so the trace benchmark
runs exactly the policy code the sidecar runs; the sidecar process never loads torch.
"""
