package flags

import (
	"bufio"
	"errors"
	"flag"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestPeerVarsAreThePeers: peerVars holds exactly the variables of
// envoyproxy/ratelimit's settings (testdata, copied by hand), with their
// defaults, so that none is silently ignored.
func TestPeerVarsAreThePeers(t *testing.T) {
	f, err := os.Open("testdata/envoy-ratelimit-settings.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]string{}
	var order []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, def, _ := strings.Cut(line, " ")
		if def == `""` {
			def = ""
		}
		if _, dup := want[name]; dup {
			t.Errorf("testdata lists %s twice", name)
		}
		want[name] = def
		order = append(order, name)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(want) < 110 {
		t.Fatalf("testdata lists %d variables; the peer has about 115", len(want))
	}
	got := map[string]peerVar{}
	for i, p := range peerVars {
		if _, dup := got[p.name]; dup {
			t.Errorf("peerVars lists %s twice", p.name)
		}
		got[p.name] = p
		if i < len(order) && order[i] != p.name {
			t.Errorf("peerVars[%d] is %s, testdata's is %s: keep the peer's order", i, p.name, order[i])
		}
	}
	for name, def := range want {
		p, ok := got[name]
		if !ok {
			t.Errorf("%s (default %q) is not in peerVars: rls serve would ignore it", name, def)
			continue
		}
		if p.def != def {
			t.Errorf("%s: default %q in peerVars, %q in the peer", name, p.def, def)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s is in peerVars but not in testdata", name)
		}
	}
}

// TestMigrationDocListsEveryPeerVar: docs/migrating-from-envoy-ratelimit.md
// says what rls serve does with each variable of the peer.
func TestMigrationDocListsEveryPeerVar(t *testing.T) {
	b, err := os.ReadFile("../../../docs/migrating-from-envoy-ratelimit.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	// Grouped rows abbreviate a prefix: `REDIS_PERSECOND_SOCKET_TYPE`, `_TYPE`, ...
	prefixes := []string{"REDIS_PERSECOND", "REDIS_AWS_IAM", "CONFIG_GRPC_XDS_CLIENT_TLS"}
	for _, p := range peerVars {
		listed := strings.Contains(doc, "`"+p.name+"`")
		for _, pre := range prefixes {
			if rest, ok := strings.CutPrefix(p.name, pre); ok && strings.Contains(doc, "`"+rest+"`") && strings.Contains(doc, "`"+pre+"_") {
				listed = true
			}
		}
		if !listed {
			t.Errorf("%s is not in the migration guide", p.name)
		}
	}
}

// TestPeerVarsAreConsistent checks each entry: a mapped variable is
// converted by exactly one peerMaps entry for its flag; a refusal says
// why; accepted values are values of the variable's kind; every flag named
// exists.
func TestPeerVarsAreConsistent(t *testing.T) {
	exists := serveFlags(t)

	converters := map[string][]string{} // variable → flags of its peerMaps entries
	for _, m := range peerMaps {
		for _, v := range m.vars {
			converters[v] = append(converters[v], m.flag)
		}
	}
	for _, p := range peerVars {
		if p.flag != "" && !exists[p.flag] {
			t.Errorf("%s names --%s, which does not exist", p.name, p.flag)
		}
		switch p.how {
		case hMapped:
			if fl := converters[p.name]; len(fl) != 1 || fl[0] != p.flag {
				t.Errorf("%s maps to --%s but peerMaps converts it to %v", p.name, p.flag, fl)
			}
		default:
			if len(converters[p.name]) > 0 {
				t.Errorf("%s is not mapped but peerMaps converts it", p.name)
			}
			if p.why == "" {
				t.Errorf("%s: refused or accepted without a why", p.name)
			}
		}
		if p.how == hAccepted && len(p.ok) == 0 && !p.anyOK {
			t.Errorf("%s is accepted with no value", p.name)
		}
		for _, ok := range p.ok {
			if err := checkKind(p.kind, ok); err != nil && ok != "" {
				t.Errorf("%s: accepted value %q %v", p.name, ok, err)
			}
		}
		if p.def != "" {
			if err := checkKind(p.kind, p.def); err != nil {
				t.Errorf("%s: default %q %v", p.name, p.def, err)
			}
		}
	}
	for v := range converters {
		found := false
		for _, p := range peerVars {
			found = found || p.name == v
		}
		if !found {
			t.Errorf("peerMaps converts %s, which is not in peerVars", v)
		}
	}
}

// serveFlags are the names of rls serve's flags, read from its usage
// (ParseServe registers them on a FlagSet of its own).
func serveFlags(t *testing.T) map[string]bool {
	var usage strings.Builder
	if _, err := ParseServe([]string{"-h"}, func(string) string { return "" }, &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, line := range strings.Split(usage.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, "  -"); ok {
			name, _, _ := strings.Cut(rest, " ")
			names[name] = true
		}
	}
	if !names["redis"] || !names["peer-env"] {
		t.Fatalf("flags read from the usage: %v", names)
	}
	return names
}

func TestSameValue(t *testing.T) {
	for _, tc := range []struct {
		k    peerKind
		a, b string
		want bool
	}{
		{kNumber, "0.80", "0.8", true},
		{kNumber, "300", "300.0", true},
		{kNumber, "0.9", "0.8", false},
		{kBool, "TRUE", "true", true},
		{kBool, "1", "true", true},
		{kBool, "yes", "true", false},
		{kDuration, "60s", "1m", true},
		{kDuration, "0", "0s", true},
		{kWord, "wait", "WAIT", true},
		{kText, "RateLimit-Limit", "ratelimit-limit", false},
	} {
		if got := sameValue(tc.k, tc.a, tc.b); got != tc.want {
			t.Errorf("sameValue(%d, %q, %q) = %v", tc.k, tc.a, tc.b, got)
		}
	}
	if strconv.Quote(escapeAll("a-b_c.d~e f/g,h@i:j")) != strconv.Quote("a-b_c.d~e%20f%2Fg%2Ch%40i%3Aj") {
		t.Errorf("escapeAll: %q", escapeAll("a-b_c.d~e f/g,h@i:j"))
	}
}
