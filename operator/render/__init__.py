"""Pure functions from a ServicePlan (and the operator settings) to Kubernetes manifests.

One module per child kind. Nothing here talks to the API server."""
