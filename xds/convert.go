package xds

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	"github.com/sluice-rls/sluice/descriptors"
)

// TypeURL is the xDS type of the resources sluice subscribes to.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// maxRefused is how many refused resources an update's error describes;
// the others are counted.
const maxRefused = 20

// maxNameBytes caps a resource's name in errors and logs: the name comes
// from the update.
const maxNameBytes = 128

// refusal is why an update was refused: the first resource refused (its
// name and wire size) and its first problem, which the log shows, and
// every problem of the first maxRefused resources, which the NACK carries.
type refusal struct {
	resource string // as resourceName; "" when the update as a whole is refused
	bytes    int    // the resource's size on the wire
	first    error
	all      []error
	more     int // resources refused beyond maxRefused
}

func (r *refusal) add(resource string, bytes int, err error) {
	if r.first == nil {
		r.resource, r.bytes, r.first = resource, bytes, firstError(err)
	}
	if len(r.all) >= maxRefused {
		r.more++
		return
	}
	r.all = append(r.all, err)
}

func (r *refusal) Error() string {
	msg := errors.Join(r.all...).Error()
	if r.more > 0 {
		msg += fmt.Sprintf("\n… and %d more resources refused", r.more)
	}
	return msg
}

func (r *refusal) err() error {
	if r.first == nil {
		return nil
	}
	return r
}

// firstError is the first of the errors err joins (errors.Join nests).
func firstError(err error) error {
	for {
		j, ok := err.(interface{ Unwrap() []error })
		if !ok || len(j.Unwrap()) == 0 {
			return err
		}
		err = j.Unwrap()[0]
	}
}

// converted is an update turned into a rule set: the rules, unless the
// update renders exactly as the rules fp names (then nothing was built),
// and its fingerprint (ruleset.Fingerprint of its rule files).
type converted struct {
	cfg *descriptors.Config
	fp  [sha256.Size]byte
}

// convert turns the resources of one update into a rule set, checking lim
// first: the update's size and resource count, then each resource's
// nesting and the descriptor count, before any resource is rendered as
// the rule file it stands for (and read by descriptors.Parse, so an
// update gets the reasons a rule file would). Each rendering is hashed
// into the update's fingerprint, parsed and dropped: no more than one is
// held at a time. When the fingerprint is same's, convert stops there and
// returns no rules: the update changes nothing. A refused update's error
// is a *refusal.
func convert(resources []*anypb.Any, lim Limits, opts descriptors.Options, same *[sha256.Size]byte) (converted, error) {
	var ref refusal
	if err := lim.checkUpdate(resources); err != nil {
		ref.add("", 0, err)
		return converted{}, &ref
	}
	cfgs := make([]*rlsconfv3.RateLimitConfig, len(resources))
	counter := treeCounter{lim: lim}
	unmarshal := proto.UnmarshalOptions{RecursionLimit: lim.recursionLimit()}
	for i, res := range resources {
		size := len(res.GetValue())
		if res.GetTypeUrl() != TypeURL {
			ref.add(resourceName(i, ""), size, fmt.Errorf("resource %d: type %q, want %q", i, clip(res.GetTypeUrl()), TypeURL))
			continue
		}
		var cfg rlsconfv3.RateLimitConfig
		if err := anypb.UnmarshalTo(res, &cfg, unmarshal); err != nil {
			// Too deep for the decoder, or not a RateLimitConfig.
			name := resourceName(i, peekName(res.GetValue()))
			ref.add(name, size, fmt.Errorf("resource %d: %w (%s, %d bytes; descriptors nest at most %d levels deep, --xds-max-depth)", i, err, name, size, lim.MaxDepth))
			continue
		}
		name := resourceName(i, cfg.GetName())
		if err := counter.check(&cfg); err != nil {
			ref.add(name, size, fmt.Errorf("%s (%d bytes): %w", name, size, err))
			if counter.descriptors > lim.MaxDescriptors {
				break // every later resource is over it too
			}
			continue
		}
		cfgs[i] = &cfg
	}
	if err := ref.err(); err != nil {
		return converted{}, err
	}

	fp := fingerprinter{h: sha256.New()}
	out := &renderBuffer{left: renderFactor * lim.MaxBytes}
	parsed := make([]*descriptors.File, 0, len(cfgs))
	sizes := make(map[string]int, len(cfgs)) // by resourceName, for New's errors
	for i, cfg := range cfgs {
		cfgs[i] = nil // dropped once rendered
		name := resourceName(i, cfg.GetName())
		out.buf.Reset()
		if err := encode(out, fileOf(cfg)); err != nil {
			if errors.Is(err, errRenderBudget) || out.left < 0 {
				err = fmt.Errorf("the update renders as more than %d bytes of rule files (%d× --max-rule-bytes): nested too deep", renderFactor*lim.MaxBytes, renderFactor)
			}
			ref.add(name, len(resources[i].GetValue()), fmt.Errorf("%s: rendering as a rule file: %w", name, err))
			break
		}
		fp.add(fullName(i, cfg.GetName()), out.buf.Bytes())
		f, err := descriptors.Parse(name, out.buf.Bytes())
		if err != nil {
			ref.add(name, len(resources[i].GetValue()), err)
			continue
		}
		parsed = append(parsed, f)
		sizes[name] = len(resources[i].GetValue())
	}
	if err := ref.err(); err != nil {
		return converted{}, err
	}
	c := converted{fp: fp.sum()}
	if same != nil && c.fp == *same {
		return c, nil
	}
	cfg, err := descriptors.New(parsed, opts)
	if err != nil {
		name := firstFile(err)
		ref.add(name, sizes[name], err)
		return converted{}, &ref
	}
	c.cfg = cfg
	return c, nil
}

// firstFile is the file (resource) the first of New's errors names.
func firstFile(err error) string {
	var de *descriptors.Error
	if errors.As(firstError(err), &de) {
		return de.File
	}
	return ""
}

// encode renders f as a rule file into out.
func encode(out *renderBuffer, f *descriptors.File) error {
	enc := yaml.NewEncoder(out)
	if err := enc.Encode(f); err != nil {
		return err
	}
	return enc.Close()
}

// errRenderBudget stops a rendering that would exceed the update's budget.
var errRenderBudget = errors.New("render budget exceeded")

// renderBuffer is the buffer a resource is rendered into, refusing to grow
// past what the update has left to render.
type renderBuffer struct {
	buf  bytes.Buffer
	left int64
}

func (b *renderBuffer) Write(p []byte) (int, error) {
	if int64(len(p)) > b.left {
		b.left = -1
		return 0, errRenderBudget
	}
	b.left -= int64(len(p))
	return b.buf.Write(p)
}

// fingerprinter computes ruleset.Fingerprint of rule files one at a time,
// so that they need not be held together; TestFingerprintMatchesRuleset
// keeps the two equal.
type fingerprinter struct{ h hash.Hash }

func (f fingerprinter) add(name string, data []byte) {
	fmt.Fprintf(f.h, "%d:%s:%d:", len(name), name, len(data))
	f.h.Write(data)
}

func (f fingerprinter) sum() [sha256.Size]byte {
	var s [sha256.Size]byte
	f.h.Sum(s[:0])
	return s
}

// resourceName is what errors and logs call a resource: "xds:<name>", or
// "xds:#<index>" for a resource without a name; a long name is cut.
func resourceName(i int, name string) string {
	return fullName(i, clip(name))
}

// fullName is resourceName without the cut: what the fingerprint hashes.
func fullName(i int, name string) string {
	if name == "" {
		return fmt.Sprintf("xds:#%d", i)
	}
	return "xds:" + name
}

// clip cuts s to maxNameBytes.
func clip(s string) string {
	if len(s) <= maxNameBytes {
		return s
	}
	return strings.ToValidUTF8(s[:maxNameBytes], "") + "…"
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
