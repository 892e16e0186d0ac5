//go:build tools

// Package tools keeps the manifest modules in go.mod and go.sum.
package tools

import (
	_ "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	_ "sigs.k8s.io/gateway-api/apis/v1beta1"
)
