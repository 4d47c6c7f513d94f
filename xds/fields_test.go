package xds_test

import (
	"math"
	"reflect"
	"strings"
	"testing"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/xdstest"
)

// withExtras sets d's quota_mode (field 7) and metadata (field 8) as the
// upstream proto encodes them: the published module's type has no such
// fields, so they go on the wire as its unknown fields.
func withExtras(t *testing.T, d *rlsconfv3.RateLimitDescriptor, quota bool, meta map[string]any) {
	t.Helper()
	b := []byte(d.ProtoReflect().GetUnknown())
	if quota {
		b = protowire.AppendTag(b, 7, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	if meta != nil {
		st, err := structpb.NewStruct(meta)
		if err != nil {
			t.Fatal(err)
		}
		enc, err := proto.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		b = protowire.AppendTag(b, 8, protowire.BytesType)
		b = protowire.AppendBytes(b, enc)
	}
	d.ProtoReflect().SetUnknown(b)
}

// TestQuotaModeAndMetadataOverXDS serves, from a real management server,
// a resource whose descriptors carry quota_mode and metadata (the fields
// the published ratelimit module lacks) and checks that the rules built
// carry them as the same rule file's do; then that a field sluice does not
// read, or metadata it cannot hold, is NACKed rather than dropped.
func TestQuotaModeAndMetadataOverXDS(t *testing.T) {
	const ruleFile = `
domain: edge
descriptors:
  - key: user
    value: alice
    quota_mode: true
    metadata: {pool: provisioned, route: {cluster: pt}, n: 3, share: 0.5, tags: [a, true, null]}
    rate_limit: {unit: minute, requests_per_unit: 10}
    descriptors:
      - key: path
        metadata: {}
        rate_limit: {unit: minute, requests_per_unit: 5}
`
	f, err := descriptors.Parse("file", []byte(ruleFile))
	if err != nil {
		t.Fatal(err)
	}
	want, err := descriptors.New([]*descriptors.File{f}, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}

	cfg := limit("edge", "user", "alice", 10)
	withExtras(t, cfg.Descriptors[0], true, map[string]any{
		"pool": "provisioned", "route": map[string]any{"cluster": "pt"},
		"n": 3, "share": 0.5, "tags": []any{"a", true, nil},
	})
	child := &rlsconfv3.RateLimitDescriptor{Key: "path", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 5}}
	withExtras(t, child, false, map[string]any{})
	cfg.Descriptors[0].Descriptors = []*rlsconfv3.RateLimitDescriptor{child}

	mgmt := xdstest.Start(t, "")
	mgmt.Set(t, node, "v1", cfg)
	h := startSource(t, mgmt.Addr)
	waitReady(t, h.src)
	mgmt.WaitRequest(t, xdstest.ACK("v1"))

	for _, entries := range [][]descriptors.Entry{
		{{Key: "user", Value: "alice"}},
		{{Key: "user", Value: "alice"}, {Key: "path", Value: "/x"}},
	} {
		got := h.store.Rules().Domain("edge").Match(entries)
		exp := want.Domain("edge").Match(entries)
		if got == nil || exp == nil {
			t.Fatalf("%v: rule from xDS %v, from the rule file %v", entries, got, exp)
		}
		if got.QuotaMode != exp.QuotaMode {
			t.Errorf("%v: quota_mode %v over xDS, %v in the rule file", entries, got.QuotaMode, exp.QuotaMode)
		}
		if !reflect.DeepEqual(got.Metadata, exp.Metadata) {
			t.Errorf("%v: metadata %#v over xDS, %#v in the rule file", entries, got.Metadata, exp.Metadata)
		}
	}
	if r := h.store.Rules().Domain("edge").Match([]descriptors.Entry{{Key: "user", Value: "alice"}}); r == nil || !r.QuotaMode || r.Metadata["pool"] != "provisioned" {
		t.Errorf("user=alice over xDS: %+v, want quota_mode and metadata pool=provisioned", r)
	}

	// A field sluice does not read (9), and metadata with a non-finite
	// number: NACKed, each named; v1 keeps deciding.
	unknown := limit("api", "path", "/x", 1)
	d := unknown.Descriptors[0]
	d.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1))
	nan := limit("nan", "k", "v", 1)
	withExtras(t, nan.Descriptors[0], false, map[string]any{"x": math.Inf(1)})
	mgmt.Set(t, node, "v2", cfg, unknown, nan)
	msg := mgmt.WaitRequest(t, xdstest.NACK).GetErrorDetail().GetMessage()
	for _, w := range []string{`version "v2"`, "xds:api: descriptor path=/x: field 9", "xds:nan: descriptor k=v: metadata: numbers must be finite"} {
		if !strings.Contains(msg, w) {
			t.Errorf("NACK error detail lacks %q:\n%s", w, msg)
		}
	}
	if got := h.version(t); got != "v1" {
		t.Errorf("after the NACK the version is %q, want v1", got)
	}
}
