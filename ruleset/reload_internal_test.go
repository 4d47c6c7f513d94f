package ruleset

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestWatchSetConcerns(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "rules")
	file := filepath.Join(dir, "rules.yaml")
	mustDo(t, os.Mkdir(dir, 0o755))
	mustDo(t, os.WriteFile(file, []byte("domain: d\n"), 0o644))
	tests := []struct {
		path, event string
		want        bool
	}{
		{dir, "rules/rules.yaml", true},
		{dir, "rules/more.yml", true},
		{dir, "rules/sluice.log", false},
		{dir, "rules/.rules.yaml.swp", false},
		{dir, "rules", true},       // the directory replaced
		{dir, "rules.new", false},  // its twin being prepared
		{dir, "other.yaml", false}, // next to the directory, not in it
		{file, "rules/rules.yaml", true},
		{file, "rules/other.yaml", false},
		{file, "rules/..data", false}, // not on the way to this file
	}
	for _, tt := range tests {
		s := newWatchSet(tt.path)
		if got := s.concerns(filepath.Join(base, tt.event)); got != tt.want {
			t.Errorf("Path %s, event on %s: concerns = %v, want %v (watching %v)", filepath.Base(tt.path), tt.event, got, tt.want, s.dirs())
		}
	}
}

// TestWatchSetFollowsLinks: a ConfigMap layout under a swapped symlink
// needs every directory holding a link on the way, and the directory
// really holding the file.
func TestWatchSetFollowsLinks(t *testing.T) {
	base := t.TempDir()
	vol := filepath.Join(base, "vol")
	mustDo(t, os.MkdirAll(filepath.Join(vol, "..2026_1"), 0o755))
	mustDo(t, os.WriteFile(filepath.Join(vol, "..2026_1", "rules.yaml"), []byte("domain: d\n"), 0o644))
	mustDo(t, os.Symlink("..2026_1", filepath.Join(vol, "..data")))
	mustDo(t, os.Symlink("..data/rules.yaml", filepath.Join(vol, "rules.yaml")))
	mustDo(t, os.Symlink("vol", filepath.Join(base, "current")))
	// A dangling rule link is watched for where its target would appear.
	mustDo(t, os.Symlink("..data/gone.yaml", filepath.Join(vol, "gone.yaml")))

	s := newWatchSet(filepath.Join(base, "current"))
	want := []string{base, vol, filepath.Join(vol, "..2026_1")}
	if got := s.dirs(); !slices.Equal(got, want) {
		t.Fatalf("dirs = %v, want %v", got, want)
	}
	for _, ev := range []string{"current", "vol/..data", "vol/rules.yaml", "vol/new.yaml", "vol/..2026_1/rules.yaml", "vol/..2026_1/gone.yaml"} {
		if !s.concerns(filepath.Join(base, ev)) {
			t.Errorf("an event on %s does not concern the rules", ev)
		}
	}
	for _, ev := range []string{"vol/..data_tmp", "vol/..2026_1/other.yaml", "other"} {
		if s.concerns(filepath.Join(base, ev)) {
			t.Errorf("an event on %s concerns the rules", ev)
		}
	}
	// A link loop ends.
	mustDo(t, os.Symlink("loop2", filepath.Join(base, "loop1")))
	mustDo(t, os.Symlink("loop1", filepath.Join(base, "loop2")))
	if s := newWatchSet(filepath.Join(base, "loop1")); len(s) != 1 {
		t.Errorf("link loop: dirs %v, want the base only", s.dirs())
	}
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
