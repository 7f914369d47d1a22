//go:build tools

// Package clusterbins pins the control-plane commands that tests run, in one module graph so
// that one `go build` compiles every package they share once. k8s.io/kubernetes replaces its
// staging modules with local paths, so a plain `go install` fails; this wrapper module replaces
// them with published versions. kwok is not here: it needs newer Kubernetes libraries (see build.sh).
package clusterbins

import (
	_ "helm.sh/helm/v3/cmd/helm"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
