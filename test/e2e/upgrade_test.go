//go:build e2e

package e2e

import "testing"

func testRollingUpgrade(t *testing.T, c *Cluster) { t.Fatal("not yet") }
