"""The router: a cache-aware OpenAI-compatible proxy in front of one InferenceService's workers.

It validates requests as the worker does, hashes their blocks exactly as the worker does, and
sends each to the replica where it costs least (``choose``). Never imports torch.
"""
