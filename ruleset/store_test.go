package ruleset_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-rls/sluice/descriptors"
)

// TestStoreOnSwap: a hook sees the current rules at once and each reload's
// before the store serves them.
func TestStoreOnSwap(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(rulesYAML(1)), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, path)
	var seen []uint64
	f.store.OnSwap(func(cfg *descriptors.Config) {
		seen = append(seen, cfg.Rules()[0].Global.Requests)
		if len(seen) > 1 && limitOf(t, f.store) != seen[len(seen)-2] {
			t.Errorf("the hook saw %d while the store already served it", seen[len(seen)-1])
		}
	})
	if err := os.WriteFile(path, []byte(rulesYAML(2)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.r.Reload(); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || seen[0] != 1 || seen[1] != 2 {
		t.Errorf("the hook saw %v, want [1 2]", seen)
	}
}
