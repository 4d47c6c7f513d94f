package xds

import (
	"errors"
	"fmt"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	"github.com/sluice-rls/sluice/descriptors"
)

// TypeURL is the xDS type of the resources sluice subscribes to.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// ruleFile is one resource in its rule-file form: the name errors carry
// and the YAML their line:column refer to.
type ruleFile struct {
	name string
	yaml []byte
}

// ruleFiles renders every resource of an update as the rule file it stands
// for. A resource of another type, or one that does not decode, is an
// error naming its index; all of them are reported at once.
func ruleFiles(resources []*anypb.Any) ([]ruleFile, error) {
	out := make([]ruleFile, 0, len(resources))
	var errs []error
	for i, res := range resources {
		if res.GetTypeUrl() != TypeURL {
			errs = append(errs, fmt.Errorf("resource %d: type %q, want %q", i, res.GetTypeUrl(), TypeURL))
			continue
		}
		var cfg rlsconfv3.RateLimitConfig
		if err := anypb.UnmarshalTo(res, &cfg, proto.UnmarshalOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("resource %d: %w", i, err))
			continue
		}
		f := fileOf(&cfg)
		data, err := yaml.Marshal(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("resource %d (%s): rendering as a rule file: %w", i, cfg.GetName(), err))
			continue
		}
		out = append(out, ruleFile{name: resourceName(i, cfg.GetName()), yaml: data})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// resourceName is what errors and logs call a resource: "xds:<name>", or
// "xds:#<index>" for a resource without a name.
func resourceName(i int, name string) string {
	if name == "" {
		return fmt.Sprintf("xds:#%d", i)
	}
	return "xds:" + name
}

// build parses the rule files of one update and builds their rule set:
// every problem of every resource, as "xds:<name>:line:column: reason" in
// the rendered rule file.
func build(files []ruleFile, opts descriptors.Options) (*descriptors.Config, error) {
	parsed := make([]*descriptors.File, 0, len(files))
	var errs []error
	for _, rf := range files {
		f, err := descriptors.Parse(rf.name, rf.yaml)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		parsed = append(parsed, f)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return descriptors.New(parsed, opts)
}

// fileOf is the rule file a RateLimitConfig stands for, field by field as
// envoyproxy/ratelimit reads it (src/config/config_xds.go): the proto has
// no burst, local block, unit_multiplier, value_to_metric or
// share_threshold, so those stay unset.
func fileOf(cfg *rlsconfv3.RateLimitConfig) *descriptors.File {
	return &descriptors.File{
		Name:        cfg.GetName(),
		Domain:      cfg.GetDomain(),
		Descriptors: descriptorsOf(cfg.GetDescriptors()),
	}
}

func descriptorsOf(pb []*rlsconfv3.RateLimitDescriptor) []descriptors.Descriptor {
	if len(pb) == 0 {
		return nil
	}
	out := make([]descriptors.Descriptor, len(pb))
	for i, d := range pb {
		out[i] = descriptors.Descriptor{
			Key:            d.GetKey(),
			Value:          d.GetValue(),
			RateLimit:      rateLimitOf(d.GetRateLimit()),
			ShadowMode:     d.GetShadowMode(),
			DetailedMetric: d.GetDetailedMetric(),
			Descriptors:    descriptorsOf(d.GetDescriptors()),
		}
	}
	return out
}

// rateLimitOf converts a policy. proto3 cannot tell requests_per_unit 0
// from an absent one; a policy that is not unlimited always has it (0
// refuses every request, as in a rule file), and an UNKNOWN unit is left
// out, so validation reports it as missing.
func rateLimitOf(pb *rlsconfv3.RateLimitPolicy) *descriptors.RateLimit {
	if pb == nil {
		return nil
	}
	r := &descriptors.RateLimit{Name: pb.GetName(), Unlimited: pb.GetUnlimited()}
	for _, rep := range pb.GetReplaces() {
		r.Replaces = append(r.Replaces, descriptors.Replace{Name: rep.GetName()})
	}
	if u, ok := unitOf(pb.GetUnit()); ok {
		r.Unit = u
	}
	if rpu := pb.GetRequestsPerUnit(); !pb.GetUnlimited() || rpu > 0 {
		r.RequestsPerUnit = &rpu // with unlimited: refused, as in a rule file
	}
	return r
}

// unitOf maps the proto's units onto sluice's (the proto has no week,
// month or year).
func unitOf(u rlsconfv3.RateLimitUnit) (descriptors.Unit, bool) {
	switch u {
	case rlsconfv3.RateLimitUnit_SECOND:
		return descriptors.Second, true
	case rlsconfv3.RateLimitUnit_MINUTE:
		return descriptors.Minute, true
	case rlsconfv3.RateLimitUnit_HOUR:
		return descriptors.Hour, true
	case rlsconfv3.RateLimitUnit_DAY:
		return descriptors.Day, true
	}
	return 0, false
}
