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
// update is the one fp names (then nothing was built), and its
// fingerprint (see fingerprinter).
type converted struct {
	cfg *descriptors.Config
	fp  [sha256.Size]byte
}

// convert turns the resources of one update into a rule set, checking lim
// first: the update's size and resource count, then each resource's
// nesting and the descriptor count. The update's fingerprint hashes each
// decoded resource (fingerprint); when it is same's, convert stops there
// and returns no rules: the update changes nothing.
//
// The rules are built straight from the decoded resources (fileOf), as the
// rule files they stand for, and validated by descriptors.New, which
// checks a File built this way as it checks a parsed one. Such a File has
// no positions, so when New refuses the update or warns about it, convert
// builds it again the way a rule file is read (build), rendering each
// resource as a rule file and reading it with descriptors.Parse, so that
// every error and warning says where in the rendering it is, as it always
// has. A refused update's error is a *refusal.
func convert(resources []*anypb.Any, lim Limits, opts descriptors.Options, same *[sha256.Size]byte) (converted, error) {
	return convertKnown(resources, lim, opts, known{applied: same})
}

// known is what a Source knows of earlier updates: the fingerprint of the
// rules in use (applied, nil before the first update), and of the last
// update refused after its resources were decoded, with why (refused).
type known struct {
	applied *[sha256.Size]byte
	refused *refusedUpdate
}

// refusedUpdate is an update refused after its resources were decoded:
// its fingerprint and the refusal.
type refusedUpdate struct {
	fp  [sha256.Size]byte
	err error
}

// convertKnown is convert, which also returns k.refused's refusal, without
// building anything, for an update with its fingerprint: a State of the
// World server sends a refused update again after each NACK. c.fp is set
// when the update was refused after its fingerprint was computed.
func convertKnown(resources []*anypb.Any, lim Limits, opts descriptors.Options, k known) (converted, error) {
	same := k.applied
	cfgs, err := decode(resources, lim)
	if err != nil {
		return converted{}, err
	}
	fp := fingerprinter{h: sha256.New()}
	for i, cfg := range cfgs {
		if err := fp.add(fullName(i, cfg.GetName()), cfg); err != nil {
			var ref refusal
			ref.add(resourceName(i, cfg.GetName()), len(resources[i].GetValue()), err)
			return converted{}, &ref
		}
	}
	c := converted{fp: fp.sum()}
	if same != nil && c.fp == *same {
		return c, nil
	}
	if k.refused != nil && c.fp == k.refused.fp {
		return c, k.refused.err
	}
	files := make([]*descriptors.File, len(cfgs))
	for i, cfg := range cfgs {
		files[i] = fileOf(cfg)
		files[i].Name = resourceName(i, cfg.GetName())
		cfgs[i] = nil // the File shares its strings; the rest is dropped
	}
	// No warning but the caller's own (opts.LoaderWarnings, which New
	// passes on): none that would name a position in a resource.
	if cfg, err := descriptors.New(files, opts); err == nil && len(cfg.Warnings()) == len(opts.LoaderWarnings) {
		c.cfg = cfg
		return c, nil
	}
	// Refused or warned about: again, with positions, from the resources.
	clear(files)
	if cfgs, err = decode(resources, lim); err != nil {
		return converted{}, err // decoded once already: not expected
	}
	cfg, err := build(resources, cfgs, lim, opts)
	if err != nil {
		return c, err
	}
	c.cfg = cfg
	return c, nil
}

// decode unmarshals the resources of one update, checking lim as it goes
// (see convert). A refused update's error is a *refusal.
func decode(resources []*anypb.Any, lim Limits) ([]*rlsconfv3.RateLimitConfig, error) {
	var ref refusal
	if err := lim.checkUpdate(resources); err != nil {
		ref.add("", 0, err)
		return nil, &ref
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
		if err := checkFields(&cfg); err != nil {
			ref.add(name, size, fmt.Errorf("%s: %w", name, err))
			continue
		}
		cfgs[i] = &cfg
	}
	if err := ref.err(); err != nil {
		return nil, err
	}
	return cfgs, nil
}

// build turns decoded resources into a rule set as the rule files they
// stand for are read: each resource is rendered as a rule file, at most
// renderFactor × lim.MaxBytes for the update (deep nesting indents every
// line), read by descriptors.Parse and dropped, so that no more than one
// rendering is held at a time. Errors and warnings then carry the line
// and column of the rendering, as a rule file's do. A refused update's
// error is a *refusal.
func build(resources []*anypb.Any, cfgs []*rlsconfv3.RateLimitConfig, lim Limits, opts descriptors.Options) (*descriptors.Config, error) {
	var ref refusal
	out := &renderBuffer{left: renderFactor * lim.MaxBytes}
	parsed := make([]*descriptors.File, 0, len(cfgs))
	sizes := make(map[string]int, len(cfgs)) // by resourceName, for New's errors
	for i, cfg := range cfgs {
		name := resourceName(i, cfg.GetName())
		out.buf.Reset()
		if err := encode(out, fileOf(cfg)); err != nil {
			if errors.Is(err, errRenderBudget) || out.left < 0 {
				err = fmt.Errorf("the update renders as more than %d bytes of rule files (%d× --max-rule-bytes): nested too deep", renderFactor*lim.MaxBytes, renderFactor)
			}
			ref.add(name, len(resources[i].GetValue()), fmt.Errorf("%s: rendering as a rule file: %w", name, err))
			break
		}
		f, err := descriptors.Parse(name, out.buf.Bytes())
		if err != nil {
			ref.add(name, len(resources[i].GetValue()), err)
			continue
		}
		parsed = append(parsed, f)
		sizes[name] = len(resources[i].GetValue())
	}
	if err := ref.err(); err != nil {
		return nil, err
	}
	cfg, err := descriptors.New(parsed, opts)
	if err != nil {
		name := firstFile(err)
		ref.add(name, sizes[name], err)
		return nil, &ref
	}
	return cfg, nil
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

// fingerprinter computes the SHA-256 that identifies an update's rules,
// one resource at a time: for each, its name (as fullName) and its
// deterministic protobuf encoding, each prefixed with its length. The same
// resources in the same order have the same fingerprint whatever the
// version or the encoding's field order on the wire.
type fingerprinter struct {
	h   hash.Hash
	buf []byte
}

func (f *fingerprinter) add(name string, cfg *rlsconfv3.RateLimitConfig) error {
	var err error
	// Deterministic: the same fields encode the same way (map entries sorted).
	f.buf, err = proto.MarshalOptions{Deterministic: true}.MarshalAppend(f.buf[:0], cfg)
	if err != nil {
		return fmt.Errorf("%s: encoding for the fingerprint: %w", clip(name), err)
	}
	fmt.Fprintf(f.h, "%d:%s:%d:", len(name), name, len(f.buf))
	f.h.Write(f.buf)
	return nil
}

func (f *fingerprinter) sum() [sha256.Size]byte {
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
// envoyproxy/ratelimit reads it (src/config/config_xds.go), quota_mode and
// metadata included (decoded from unknown fields: see extras.go): the
// proto has no burst, local block, unit_multiplier, value_to_metric or
// share_threshold, so those stay unset. A field sluice does not read
// refuses the update (checkFields) rather than vanish.
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
		x, _ := extrasOf(d) // checked by decode (checkFields)
		out[i] = descriptors.Descriptor{
			Key:            d.GetKey(),
			Value:          d.GetValue(),
			RateLimit:      rateLimitOf(d.GetRateLimit()),
			ShadowMode:     d.GetShadowMode(),
			QuotaMode:      x.quotaMode,
			Metadata:       x.metadata,
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

// The units the upstream proto (envoy ratelimit/config/ratelimit/v3/
// rls_conf.proto) added after the published ratelimit module: they arrive
// as these numbers, which Envoy Gateway sends for its Month and Year.
const (
	unitMonth rlsconfv3.RateLimitUnit = 5
	unitYear  rlsconfv3.RateLimitUnit = 6
	unitWeek  rlsconfv3.RateLimitUnit = 7
)

// unitOf maps the proto's units onto sluice's.
func unitOf(u rlsconfv3.RateLimitUnit) (descriptors.Unit, bool) {
	switch u {
	case unitWeek:
		return descriptors.Week, true
	case unitMonth:
		return descriptors.Month, true
	case unitYear:
		return descriptors.Year, true
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
