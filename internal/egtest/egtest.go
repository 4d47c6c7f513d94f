// Package egtest reads the rate-limit Deployment Envoy Gateway generates
// (a copy pinned in cmd/rls/flags/testdata), for the tests that run rls as
// that Deployment would.
package egtest

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"gopkg.in/yaml.v3"
)

// Container is what the tests use of the Deployment's one container.
type Container struct {
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []EnvVar `yaml:"env"`
	Ports   []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe struct {
		HTTPGet struct {
			Path string `yaml:"path"`
			Port int    `yaml:"port"`
		} `yaml:"httpGet"`
	} `yaml:"readinessProbe"`
}

// EnvVar is one variable of the container's env (Envoy Gateway sets
// values, no valueFrom, in the default Deployment).
type EnvVar struct {
	Name  string `yaml:"name"`
	Value string `yaml:"value"`
}

// Load reads the pinned Deployment and returns its container.
func Load(t testing.TB) Container {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(here), "..", "..", "cmd", "rls", "flags", "testdata", "envoy-gateway-ratelimit-deployment.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []Container `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("%s: %d containers, want 1", path, n)
	}
	return d.Spec.Template.Spec.Containers[0]
}

// Getenv returns a getenv of the container's env, with replace's values
// replacing or adding variables.
func (c Container) Getenv(replace map[string]string) func(string) string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	for k, v := range replace {
		env[k] = v
	}
	return func(name string) string { return env[name] }
}
