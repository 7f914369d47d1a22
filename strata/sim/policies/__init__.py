"""Scaling policies, each a small module behind ``base.Scaler``: static provisioning (at peak,
at mean), a KV-usage threshold scaler (llm-d's saturation analyzer), a Knative/AIBrix-style KPA,
a Dynamo-style SLA planner, and the project's own builtin autoscaler."""
