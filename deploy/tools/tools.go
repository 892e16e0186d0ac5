//go:build tools

// Package tools names the upstream commands deploy/validate builds from this
// module: helm, pinned here so that kube-env/go/align can point its
// Kubernetes libraries at kube-env/go/kubernetes's versions and its build
// reuses the packages compiled for kube-env (go install PKG@VERSION cannot
// take a replace directive).
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
