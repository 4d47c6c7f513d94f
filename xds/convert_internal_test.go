package xds

import (
	"fmt"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
)

// setExtras sets d's quota_mode and metadata as unknown fields, as the
// upstream proto (fields 7 and 8) encodes them.
func setExtras(t *testing.T, d *rlsconfv3.RateLimitDescriptor, quota bool, meta map[string]any) {
	t.Helper()
	var b []byte
	if quota {
		b = protowire.AppendVarint(protowire.AppendTag(b, fieldQuotaMode, protowire.VarintType), 1)
	}
	st, err := structpb.NewStruct(meta)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := proto.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendBytes(protowire.AppendTag(b, fieldMetadata, protowire.BytesType), enc)
	d.ProtoReflect().SetUnknown(b)
}

func anyOf(t *testing.T, cfgs ...*rlsconfv3.RateLimitConfig) []*anypb.Any {
	t.Helper()
	out := make([]*anypb.Any, len(cfgs))
	for i, c := range cfgs {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

// rulesOf builds an update and returns its /rlconfig lines.
func rulesOf(t *testing.T, res []*anypb.Any) ([]string, error) {
	t.Helper()
	conv, err := convert(res, Limits{}.withDefaults(), descriptors.Options{}, nil)
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, r := range conv.cfg.Rules() {
		lines = append(lines, r.String())
	}
	return lines, nil
}

// TestConvert: every field of the proto reaches the rule set, as the same
// rule file would give it.
func TestConvert(t *testing.T) {
	cfg := &rlsconfv3.RateLimitConfig{
		Name:   "edge-config",
		Domain: "edge",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "remote_address", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 100}},
			{Key: "remote_address", Value: "50.0.0.5", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY}},
			{Key: "health", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true}},
			{Key: "route", Value: "/api/*", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
				Key: "user", ShadowMode: true, DetailedMetric: true,
				RateLimit: &rlsconfv3.RateLimitPolicy{
					Name: "per_user", Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 10,
					Replaces: []*rlsconfv3.RateLimitReplace{{Name: "per_minute"}},
				},
			}}},
			{Key: "minute", RateLimit: &rlsconfv3.RateLimitPolicy{Name: "per_minute", Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 5}},
		},
	}
	got, err := rulesOf(t, anyOf(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	yamlRules := `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: day, requests_per_unit: 0}
  - key: health
    rate_limit: {unlimited: true}
  - key: route
    value: /api/*
    descriptors:
      - key: user
        shadow_mode: true
        detailed_metric: true
        rate_limit: {name: per_user, unit: hour, requests_per_unit: 10, replaces: [{name: per_minute}]}
  - key: minute
    rate_limit: {name: per_minute, unit: minute, requests_per_unit: 5}
`
	f, err := descriptors.Parse("edge.yaml", []byte(yamlRules))
	if err != nil {
		t.Fatal(err)
	}
	want, err := descriptors.New([]*descriptors.File{f}, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wantLines []string
	for _, r := range want.Rules() {
		wantLines = append(wantLines, r.String())
	}
	if strings.Join(got, "\n") != strings.Join(wantLines, "\n") {
		t.Errorf("rules from the proto:\n%s\nwant, as the rule file gives them:\n%s", strings.Join(got, "\n"), strings.Join(wantLines, "\n"))
	}
}

// TestConvertUpstreamUnits: week, month and year, which the published
// ratelimit module does not name, arrive by number (Envoy Gateway sends
// month and year) and convert as a rule file's.
func TestConvertUpstreamUnits(t *testing.T) {
	cfg := &rlsconfv3.RateLimitConfig{Name: "edge", Domain: "edge", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "w", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: 7, RequestsPerUnit: 1}},
		{Key: "m", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: 5, RequestsPerUnit: 2}},
		{Key: "y", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: 6, RequestsPerUnit: 3}},
	}}
	got, err := rulesOf(t, anyOf(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	f, err := descriptors.Parse("edge.yaml", []byte(`domain: edge
descriptors:
  - {key: w, rate_limit: {unit: week, requests_per_unit: 1}}
  - {key: m, rate_limit: {unit: month, requests_per_unit: 2}}
  - {key: y, rate_limit: {unit: year, requests_per_unit: 3}}
`))
	if err != nil {
		t.Fatal(err)
	}
	want, err := descriptors.New([]*descriptors.File{f}, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wantLines []string
	for _, r := range want.Rules() {
		wantLines = append(wantLines, r.String())
	}
	if strings.Join(got, "\n") != strings.Join(wantLines, "\n") {
		t.Errorf("rules from the proto:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantLines, "\n"))
	}
}

func TestConvertErrors(t *testing.T) {
	unnamed := &rlsconfv3.RateLimitConfig{Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{RequestsPerUnit: 3}}}}
	noDomain := &rlsconfv3.RateLimitConfig{Name: "nodomain"}
	wrongType, err := anypb.New(durationpb.New(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	garbled := &anypb.Any{TypeUrl: TypeURL, Value: []byte{0xff, 0xff}}
	one := func(name string) *rlsconfv3.RateLimitConfig {
		return &rlsconfv3.RateLimitConfig{Name: name, Domain: name, Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1}}}}
	}
	deep := map[string]any{"leaf": 1.0}
	for range 3 * maxMetadataDepth {
		deep = map[string]any{"m": deep}
	}
	deepMeta := one("deep")
	setExtras(t, deepMeta.Descriptors[0], false, deep)
	quotaBytes := one("quotabytes") // quota_mode sent as bytes: not a bool
	quotaBytes.Descriptors[0].ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, fieldQuotaMode, protowire.BytesType), []byte("yes")))
	policyField := one("policyfield")
	policyField.Descriptors[0].RateLimit.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 6, protowire.VarintType), 1))
	configField := one("configfield")
	configField.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.VarintType), 1))
	tests := []struct {
		name string
		res  []*anypb.Any
		want []string
	}{
		{"no unit, unnamed", anyOf(t, unnamed), []string{"xds:#0:", "rate_limit has requests_per_unit but no unit"}},
		{"no domain", anyOf(t, noDomain), []string{"xds:nodomain:", "domain is required"}},
		{"duplicate domain", anyOf(t, &rlsconfv3.RateLimitConfig{Name: "a", Domain: "d"}, &rlsconfv3.RateLimitConfig{Name: "b", Domain: "d"}), []string{"xds:b:", `duplicate domain "d"`}},
		{"wrong type", []*anypb.Any{wrongType}, []string{"resource 0", "google.protobuf.Duration", TypeURL}},
		{"garbled", []*anypb.Any{garbled}, []string{"resource 0:"}},
		{"metadata too deep", anyOf(t, deepMeta), []string{"xds:deep: descriptor k: metadata:", "64 levels"}},
		{"quota_mode not a bool", anyOf(t, quotaBytes), []string{"xds:quotabytes: descriptor k: field 7 (wire type 2)"}},
		{"unknown policy field", anyOf(t, policyField), []string{"xds:policyfield: descriptor k: rate_limit has fields sluice does not read"}},
		{"unknown config field", anyOf(t, configField), []string{"xds:configfield: the RateLimitConfig has fields sluice does not read"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := rulesOf(t, tt.res)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestNackMessageIsCapped(t *testing.T) {
	msg := nackMessage("v9", errString(strings.Repeat("é", maxNackBytes)))
	if len(msg) > maxNackBytes+64 || !strings.Contains(msg, "more bytes)") || !strings.HasPrefix(msg, `sluice rejected RateLimitConfig version "v9"`) {
		t.Errorf("capped message: %d bytes, ends %q", len(msg), msg[len(msg)-40:])
	}
	if !strings.Contains(nackMessage("v1", errString("short")), "short") {
		t.Error("a short message is cut")
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func TestJitterBounds(t *testing.T) {
	for _, d := range []time.Duration{time.Second, 3 * time.Nanosecond, 30 * time.Second} {
		for range 1000 {
			if got := jitter(d); got < d/2 || got > d {
				t.Fatalf("jitter(%v) = %v, want within [%v, %v]", d, got, d/2, d)
			}
		}
	}
}

// TestConvertWarns: what envoyproxy/ratelimit loads, over xDS as from a
// file, is applied with its meaning and a warning: here a rate beside
// unlimited, which the peer ignores.
func TestConvertWarns(t *testing.T) {
	unlimitedRate := &rlsconfv3.RateLimitConfig{Name: "u", Domain: "u", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true, RequestsPerUnit: 3}}}}
	conv, err := convert(anyOf(t, unlimitedRate), Limits{}.withDefaults(), descriptors.Options{}, nil)
	if err != nil {
		t.Fatalf("convert: %v; want the peer's meaning, unlimited", err)
	}
	cfg := conv.cfg
	if r := cfg.Domain("u").Match([]descriptors.Entry{{Key: "k", Value: "v"}}); r == nil || !r.Unlimited {
		t.Errorf("rule %v, want unlimited", r)
	}
	if w := cfg.Warnings(); len(w) != 1 || !strings.HasPrefix(w[0].Error(), "xds:u:") || !strings.Contains(w[0].Reason, "requests_per_unit is ignored: the rate_limit is unlimited") {
		t.Errorf("Warnings() = %v, want one naming xds:u and the ignored requests_per_unit", w)
	}
}

// TestBuiltAsRendered: the rules built straight from the resources are
// those the resources' renderings as rule files give, field for field
// (ruleset.Diff finds no change), for every field of the proto and for
// strings YAML would quote or read as another type.
func TestBuiltAsRendered(t *testing.T) {
	odd := []string{"007", "true", "null", "~", "a: b", "#x", "- y", " padded ", "é✓", "tab\there", "line\nbreak", "'q'", `"dq"`, "*", "{x}", "[y]", "&a", "!t", "%p", "@at", "0x1F", "1e3", ".inf"}
	cfg := &rlsconfv3.RateLimitConfig{Name: "odd", Domain: "odd"}
	for i, s := range odd {
		cfg.Descriptors = append(cfg.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: s, Value: s, ShadowMode: i%2 == 0, DetailedMetric: i%3 == 0,
			RateLimit:   &rlsconfv3.RateLimitPolicy{Name: s, Unit: rlsconfv3.RateLimitUnit(1 + i%4), RequestsPerUnit: uint32(i)},
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: s, RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true}}}})
		if i%2 == 1 {
			setExtras(t, cfg.Descriptors[len(cfg.Descriptors)-1], true, map[string]any{s: s, "n": float64(i), "f": 1.5, "big": 1e20, "l": []any{s, false, nil, map[string]any{s: 7}}})
		}
	}
	cfg.Descriptors = append(cfg.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: "r", RateLimit: &rlsconfv3.RateLimitPolicy{
		Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1, Replaces: []*rlsconfv3.RateLimitReplace{{Name: "007"}, {Name: "a: b"}}}})
	fleet, _ := fleetUpdate(t, 50)
	for name, res := range map[string][]*anypb.Any{"odd strings": anyOf(t, cfg), "a fleet": fleet} {
		t.Run(name, func(t *testing.T) {
			lim := Limits{}.withDefaults()
			cfgs, err := decode(res, lim)
			if err != nil {
				t.Fatal(err)
			}
			conv, err := convert(res, lim, descriptors.Options{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			rendered, err := build(res, cfgs, lim, descriptors.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if conv.cfg.Len() != rendered.Len() || conv.cfg.Len() == 0 {
				t.Fatalf("%d rules built, %d rendered", conv.cfg.Len(), rendered.Len())
			}
			if d := ruleset.Diff(rendered, conv.cfg); len(d) > 0 {
				t.Errorf("built differs from rendered: %+v", d)
			}
			for i, r := range rendered.Rules() {
				b := conv.cfg.Rules()[i]
				if b.Path != r.Path || b.QuotaMode != r.QuotaMode || !reflect.DeepEqual(b.Metadata, r.Metadata) {
					t.Errorf("rule %s: built quota_mode %v metadata %#v; rendered %s: %v %#v", b.Path, b.QuotaMode, b.Metadata, r.Path, r.QuotaMode, r.Metadata)
				}
			}
			if len(conv.cfg.Warnings()) != 0 || len(rendered.Warnings()) != 0 {
				t.Errorf("warnings: built %v, rendered %v", conv.cfg.Warnings(), rendered.Warnings())
			}
		})
	}
}

// TestCallersWarningsKeepTheDirectBuild: warnings the caller passes in
// (descriptors.Options.LoaderWarnings) do not send a valid update through
// the rendering: its rules are built directly, and a resource's own
// warning still gets its position.
func TestCallersWarningsKeepTheDirectBuild(t *testing.T) {
	opts := descriptors.Options{LoaderWarnings: []*descriptors.Error{{File: "flags", Reason: "a caller's warning"}}}
	res, _ := fleetUpdate(t, 10)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	conv, err := convert(res, Limits{}.withDefaults(), opts, nil)
	runtime.ReadMemStats(&after)
	if err != nil || len(conv.cfg.Warnings()) != 1 {
		t.Fatalf("convert: %v, warnings %v; want the caller's one", err, conv.cfg.Warnings())
	}
	cfgs, err := decode(res, Limits{}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	var mid, end runtime.MemStats
	runtime.ReadMemStats(&mid)
	if _, err := build(res, cfgs, Limits{}.withDefaults(), opts); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&end)
	if direct, rendered := after.TotalAlloc-before.TotalAlloc, end.TotalAlloc-mid.TotalAlloc; direct*2 > rendered {
		t.Errorf("convert allocated %d bytes, rendering alone %d: the update was rendered", direct, rendered)
	}
	unlimitedRate := &rlsconfv3.RateLimitConfig{Name: "u", Domain: "u", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true, RequestsPerUnit: 3}}}}
	conv, err = convert(anyOf(t, unlimitedRate), Limits{}.withDefaults(), opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if w := conv.cfg.Warnings(); len(w) != 2 || !regexp.MustCompile(`xds:u:\d+:\d+: `).MatchString(fmt.Sprint(w)) {
		t.Errorf("warnings %v, want the caller's and the resource's, with its position", w)
	}
}
