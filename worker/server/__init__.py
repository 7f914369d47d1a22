"""The HTTP face of the worker: the OpenAI API, health, readiness and metrics."""
