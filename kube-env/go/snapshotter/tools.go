//go:build tools

// Package tools names the upstream commands this module builds.
package tools

import (
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter"
)
