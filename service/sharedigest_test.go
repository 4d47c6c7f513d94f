package service_test

import (
	"testing"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/service"
)

// TestSettingsShareDigest: --share is the default a rule's share is
// resolved with; under --quota-mode no rule holds one.
func TestSettingsShareDigest(t *testing.T) {
	f, err := descriptors.Parse("rules.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := descriptors.New([]*descriptors.File{f}, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := (service.Settings{}).ShareDigest(cfg); got != 0 {
		t.Errorf("no share: digest %x, want 0", got)
	}
	if got, want := (service.Settings{Share: 0.5}).ShareDigest(cfg), cfg.ShareDigest(500_000); got == 0 || got != want {
		t.Errorf("--share 0.5: digest %x, want %x (not 0)", got, want)
	}
	if got := (service.Settings{Share: 0.5, QuotaMode: true}).ShareDigest(cfg); got != 0 {
		t.Errorf("--share 0.5 --quota-mode: digest %x, want 0", got)
	}
}
