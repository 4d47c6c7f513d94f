package schema

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

const composeFile = "../compose/compose.yaml"

// loadCompose loads compose file content with compose-go, as docker compose
// does: validated against the Compose specification's schema (unknown keys
// are errors), interpolated, normalized, with relative paths resolved
// against ../compose.
func loadCompose(t *testing.T, content []byte) (*types.Project, error) {
	t.Helper()
	dir, err := filepath.Abs(filepath.Dir(composeFile))
	if err != nil {
		t.Fatal(err)
	}
	return loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "compose.yaml"), Content: content}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) { o.SetProjectName("sluice-example", true) })
}

// TestComposeLoads loads compose.yaml and checks its structure: the five
// services, every bind mount's source exists in the repository, sluice is
// built from the repository's Dockerfile, and depends_on names services.
func TestComposeLoads(t *testing.T) {
	data, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	p, err := loadCompose(t, data)
	if err != nil {
		t.Fatalf("%s: %v", composeFile, err)
	}
	for _, name := range []string{"envoy", "sluice", "redis", "prometheus", "grafana", "backend"} {
		if _, ok := p.Services[name]; !ok {
			t.Errorf("no service %s among %v", name, p.ServiceNames())
		}
	}
	for name, s := range p.Services {
		for _, v := range s.Volumes {
			if v.Type != types.VolumeTypeBind {
				continue
			}
			if _, err := os.Stat(v.Source); err != nil {
				t.Errorf("service %s mounts %s at %s: %v", name, v.Source, v.Target, err)
			}
			if !v.ReadOnly {
				t.Errorf("service %s mounts %s read-write", name, v.Source)
			}
		}
		for dep := range s.DependsOn {
			if _, ok := p.Services[dep]; !ok {
				t.Errorf("service %s depends on %s, which is not a service", name, dep)
			}
		}
	}
	if b := p.Services["sluice"].Build; b == nil {
		t.Error("service sluice has no build")
	} else if _, err := os.Stat(filepath.Join(b.Context, b.Dockerfile)); err != nil {
		t.Errorf("service sluice builds %s in %s: %v", b.Dockerfile, b.Context, err)
	}
	if hc := p.Services["redis"].HealthCheck; hc == nil || len(hc.Test) == 0 {
		t.Error("service redis has no healthcheck, which sluice's depends_on waits for")
	}
}

// TestComposeCatchesTypos shows that the loader refuses typos.
func TestComposeCatchesTypos(t *testing.T) {
	data, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ old, new, errHas string }{
		{"depends_on:", "depend_on:", "depend_on"},
		{"healthcheck:", "health_check:", "health_check"},
		{"      retries: 10", "      retry: 10", "retry"},
		{"condition: service_healthy", "condition: service_healty", "condition value must be one of"},
		{"dockerfile: Dockerfile", "docker_file: Dockerfile", "docker_file"},
	} {
		if !bytes.Contains(data, []byte(c.old)) {
			t.Errorf("%s does not contain %q", composeFile, c.old)
			continue
		}
		_, err := loadCompose(t, bytes.Replace(data, []byte(c.old), []byte(c.new), 1))
		if err == nil {
			t.Errorf("%q → %q: loads without error", c.old, c.new)
			continue
		}
		if !strings.Contains(err.Error(), c.errHas) {
			t.Errorf("%q → %q: error %q does not mention %q", c.old, c.new, err, c.errHas)
		}
		t.Logf("caught: %v", err)
	}
}
