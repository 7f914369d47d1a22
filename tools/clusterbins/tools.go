//go:build tools

// Package clusterbins pins the Kubernetes control-plane commands that tests run.
// k8s.io/kubernetes replaces its staging modules with local paths, so a plain
// `go install` fails; this wrapper module replaces them with published versions.
package clusterbins

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
