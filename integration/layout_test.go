//go:build integration

package integration

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencyDirection guards the layout the README's table describes:
// backends, config and descriptors never import service; descriptors
// imports no other sluice package and no Redis client.
func TestDependencyDirection(t *testing.T) {
	const mod = "github.com/sluice-rls/sluice/"
	deps := func(pkg string) []string {
		out, err := exec.Command("go", "list", "-deps", "../"+pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	for _, pkg := range []string{"backend/memory", "backend/redis", "config", "descriptors"} {
		for _, d := range deps(pkg) {
			if d == mod+"service" {
				t.Errorf("%s imports service", pkg)
			}
		}
	}
	for _, d := range deps("descriptors") {
		if (strings.HasPrefix(d, mod) && d != mod+"descriptors") || strings.Contains(d, "go-redis") {
			t.Errorf("descriptors depends on %s", d)
		}
	}
}
