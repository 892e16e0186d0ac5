//go:build tools

// Package tools names the upstream commands this module builds.
package tools

import (
	_ "github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer"
)
