"""A load generator that replays a slice of a shared Mooncake trace at an OpenAI endpoint.

``trace`` turns trace records into timed requests whose prompts share token blocks exactly where
the trace's ``hash_ids`` do, so prefix reuse is real; ``replay`` sends them with the official
``openai`` client and records what each client saw; ``summary`` reduces those records to the
figures the demo and the end-to-end tests report."""
