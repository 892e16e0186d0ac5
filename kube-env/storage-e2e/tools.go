//go:build tools

// Package tools names what kube-env/storage-e2e/run builds from the pinned module:
// Kubernetes' end-to-end suite (with its storage tests), the agnhost image's
// program, and the ginkgo CLI that runs the suite in parallel.
package tools

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/e2e/storage/external"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
