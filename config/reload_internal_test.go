package config

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReloaderConcerns(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(file, []byte("domain: d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path, event string
		want        bool
	}{
		{dir, "rules.yaml", true},
		{dir, "more.yml", true},
		{dir, "..data", true},
		{dir, "..data_tmp", true},
		{dir, "sluice.log", false},
		{dir, ".rules.yaml.swp", false},
		{file, "rules.yaml", true},
		{file, "other.yaml", false},
		{file, "..data", true},
	}
	for _, tt := range tests {
		r := &Reloader{Path: tt.path}
		if got := r.concerns(filepath.Join(dir, tt.event)); got != tt.want {
			t.Errorf("Path %s, event on %s: concerns = %v, want %v", filepath.Base(tt.path), tt.event, got, tt.want)
		}
	}
}
