// Package egtest reads the command, environment and readiness probe of the
// container in the rate-limit Deployment Envoy Gateway generates (recorded
// in cmd/rls/flags/testdata), for the tests that run rls as that container.
package egtest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// Container is what the tests use of the Deployment's one container.
type Container struct {
	Command []string
	Args    []string
	Env     []EnvVar
	// ReadinessProbe is the container's HTTP readiness probe.
	ReadinessProbe struct {
		HTTPGet struct {
			Path string
			Port int
		}
	}
}

// EnvVar is one variable of the container's env (Envoy Gateway sets
// values, no valueFrom, in the default Deployment).
type EnvVar struct {
	Name  string
	Value string
}

// Load reads the recorded container.
func Load(t testing.TB) Container {
	t.Helper()
	path, err := recording()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Command   []string `yaml:"command"`
		Args      []string `yaml:"args"`
		Env       []string `yaml:"env"`
		Readiness struct {
			Path string `yaml:"path"`
			Port int    `yaml:"port"`
		} `yaml:"readiness"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	c := Container{Command: f.Command, Args: f.Args}
	c.ReadinessProbe.HTTPGet.Path, c.ReadinessProbe.HTTPGet.Port = f.Readiness.Path, f.Readiness.Port
	for _, e := range f.Env {
		name, value, ok := strings.Cut(e, "=")
		if !ok {
			t.Fatalf("%s: env %q is not NAME=value", path, e)
		}
		c.Env = append(c.Env, EnvVar{Name: name, Value: value})
	}
	return c
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

// recordingPath is where the container is recorded, from the repository's
// root.
var recordingPath = filepath.Join("cmd", "rls", "flags", "testdata", "envoy-gateway-ratelimit-container.yaml")

// recording finds the recorded container from the test's directory (a
// package's directory: go test runs each package's tests there) up. The
// source file's own path would not do: builds with -trimpath (make test's)
// record it relative to the module.
func recording() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		path := filepath.Join(dir, recordingPath)
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", fmt.Errorf("%s: not found in the test's directory or any above it", recordingPath)
		}
		dir = up
	}
}
