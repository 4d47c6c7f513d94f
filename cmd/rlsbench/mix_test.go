package main

import (
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

func TestBuildPool(t *testing.T) {
	tests := []struct {
		name        string
		opts        poolOptions
		size        int
		descriptors int
		minDistinct int // distinct request texts
	}{
		{"spread", poolOptions{Mix: mixSpread, Domain: "edge", Keys: 1000}, 1000, 1, 990},
		{"hot", poolOptions{Mix: mixHot, Domain: "edge", HotValue: "10.0.0.9"}, 1, 1, 1},
		{"envoy", poolOptions{Mix: mixEnvoy, Domain: "edge"}, envoyPool, 3, envoyPool * 9 / 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool, err := buildPool(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(pool) != tt.size {
				t.Fatalf("pool size = %d, want %d", len(pool), tt.size)
			}
			distinct := map[string]bool{}
			for _, r := range pool {
				if r.GetDomain() != tt.opts.Domain || len(r.GetDescriptors()) != tt.descriptors {
					t.Fatalf("request %v: want domain %q and %d descriptors", r, tt.opts.Domain, tt.descriptors)
				}
				distinct[describe(r)] = true
			}
			if len(distinct) < tt.minDistinct {
				t.Errorf("%d distinct requests, want at least %d", len(distinct), tt.minDistinct)
			}
		})
	}
}

func TestEnvoyMixShape(t *testing.T) {
	pool, err := buildPool(poolOptions{Mix: mixEnvoy, Domain: "edge", Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	addrs, users, routes := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, r := range pool {
		d := r.GetDescriptors()
		if got := describe(r); !strings.HasPrefix(got, "remote_address=") {
			t.Fatalf("request %s: want remote_address first", got)
		}
		addrs[d[0].GetEntries()[0].GetValue()] = true
		user := d[1].GetEntries()[0].GetValue()
		users[user] = true
		e := d[2].GetEntries()
		if len(e) != 2 || e[0].GetKey() != "route" || e[1].GetKey() != "user_id" || e[1].GetValue() != user {
			t.Fatalf("request %s: want route+user_id of the same user last", describe(r))
		}
		routes[e[0].GetValue()] = true
	}
	if len(addrs) > envoyAddresses || len(addrs) < envoyAddresses*9/10 {
		t.Errorf("%d addresses, want close to %d", len(addrs), envoyAddresses)
	}
	if len(users) != envoyUsers || len(routes) != len(envoyRoutes) {
		t.Errorf("%d users and %d routes, want %d and %d", len(users), len(routes), envoyUsers, len(envoyRoutes))
	}
}

func TestBuildPoolRejects(t *testing.T) {
	for _, o := range []poolOptions{{Mix: "burst"}, {Mix: mixSpread, Keys: 0}} {
		if _, err := buildPool(o); err == nil {
			t.Errorf("buildPool(%+v) = nil error, want one", o)
		}
	}
}

// describe renders a request as "k=v,k=v;k=v".
func describe(r *rlsv3.RateLimitRequest) string {
	var ds []string
	for _, d := range r.GetDescriptors() {
		var es []string
		for _, e := range d.GetEntries() {
			es = append(es, e.GetKey()+"="+e.GetValue())
		}
		ds = append(ds, strings.Join(es, ","))
	}
	return strings.Join(ds, ";")
}
