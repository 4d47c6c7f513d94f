package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// mod is the module path every sluice package starts with.
const mod = "github.com/sluice-rls/sluice/"

// allowedImports pins the arrows of the package graph the README's layout
// table describes: for each package, the sluice packages it may import
// (tests aside). The node assembles everything a running node needs, and
// nothing but cmd/ imports it; cmd/rls parses flags into node.Options and
// runs the client commands; its flags read the defaults of the packages
// that own them; the service sees the bucket
// contract and the rules, never a backend or the fail-open switch; the
// fail-open switch sees the contract, never a backend; backends and rules
// see only the contract, the leased layer and Redis also the lease protocol
// they share (never each other); the contract sees nothing.
var allowedImports = map[string][]string{
	"bucket":              {},
	"bucket/buckettest":   {"bucket"},
	"descriptors":         {"bucket"},
	"ruleset":             {"audit", "descriptors"},
	"xds":                 {"audit", "descriptors", "ruleset"},
	"backend/memory":      {"bucket"},
	"backend/redis":       {"backend/leaseproto", "bucket"},
	"backend/leaseproto":  {"bucket"},
	"backend/lease":       {"backend/leaseproto", "bucket"},
	"backend/share":       {"backend/memory", "bucket"},
	"fallback":            {"bucket"},
	"service":             {"bucket", "descriptors", "override"},
	"override":            {"audit", "bucket", "descriptors"},
	"override/redisstore": {"override"},
	"adaptive":            {"audit", "descriptors", "override"},
	"adaptive/redislock":  {"adaptive"},
	"tracing":             {},
	"statsd":              {},
	"emergency":           {},
	"audit":               {},
	"audit/redisaudit":    {"audit"},
	"node":                {"adaptive", "adaptive/redislock", "audit", "audit/redisaudit", "backend/lease", "backend/memory", "backend/redis", "backend/share", "bucket", "descriptors", "emergency", "fallback", "override", "override/redisstore", "ruleset", "service", "statsd", "tracing", "xds"},
	"cmd/rls":             {"adaptive", "audit", "audit/redisaudit", "backend/redis", "cmd/rls/flags", "descriptors", "node", "override", "ruleset", "service"},
	"cmd/rls/flags":       {"audit/redisaudit", "backend/lease", "backend/memory", "backend/redis", "fallback", "node", "override", "ruleset", "service", "statsd", "tracing", "xds"},
	"cmd/rlsbench":        {},
}

// TestDependencyDirection checks every package's sluice imports against
// allowedImports, that every package is listed there and in the README's
// layout table, and that the bucket contract depends on the standard
// library alone.
func TestDependencyDirection(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports", "../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(p.ImportPath, mod)
		if !strings.Contains(string(readme), "| `"+name+"` |") {
			t.Errorf("package %s is missing from the README's layout table", name)
		}
		if strings.HasPrefix(name, "internal/") || name == "integration" || name == "envoy-examples" {
			continue // test support
		}
		allowed, ok := allowedImports[name]
		if !ok {
			t.Errorf("package %s is not in allowedImports: add it, with its arrows, and to the README's layout table", name)
			continue
		}
		for _, imp := range p.Imports {
			if dep, ok := strings.CutPrefix(imp, mod); ok && !slices.Contains(allowed, dep) {
				t.Errorf("%s imports %s, which the layout does not allow", name, dep)
			}
		}
	}
	deps, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "../bucket").Output()
	if err != nil {
		t.Fatalf("go list -deps bucket: %v", err)
	}
	if got := strings.Fields(string(deps)); !slices.Equal(got, []string{mod + "bucket"}) {
		t.Errorf("bucket depends on %v, want the standard library alone", got)
	}
}
