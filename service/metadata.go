package service

import (
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata builds the response's dynamic_metadata as
// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does, which Envoy
// stores under envoy.filters.http.ratelimit for later filters and access
// logs:
//
//	domain       the request's domain
//	descriptors  one {entries: ["key=value", …], limit, hitsAddend} per
//	             descriptor as sent, except entries of emergencyKey (the
//	             emergency secret, which Envoy's access logs must not
//	             see); limit (the override in protobuf text form) and
//	             hitsAddend only when the descriptor has them
//	hitsAddend   the request's hits_addend, when not 0
//	metadata     the metadata of the rules whose descriptor is answered OK
//	             (not unlimited, not limited by an override), merged in
//	             request order: a key set earlier wins, except that two
//	             mappings under one key are merged the same way
//
// sc is nil when no rule was consulted (unknown domain, a bypass). Only
// built with Options.ResponseMetadata: it allocates per descriptor.
func dynamicMetadata(req *rlsv3.RateLimitRequest, sc *scratch, resp *rlsv3.RateLimitResponse, emergencyKey string) *structpb.Struct {
	fields := map[string]*structpb.Value{
		"domain": structpb.NewStringValue(req.GetDomain()),
	}
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	var b strings.Builder
	for _, d := range req.GetDescriptors() {
		entries := make([]*structpb.Value, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			if emergencyKey != "" && e.GetKey() == emergencyKey {
				continue
			}
			b.Reset()
			b.WriteString(e.GetKey())
			b.WriteByte('=')
			b.WriteString(e.GetValue())
			entries = append(entries, structpb.NewStringValue(b.String()))
		}
		df := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			df["limit"] = structpb.NewStringValue(l.String())
		}
		if h := d.GetHitsAddend(); h != nil {
			df["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: df}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	if sc != nil {
		var merged *structpb.Struct
		for i := range sc.descs {
			ds := &sc.descs[i]
			if ds.rule == nil || ds.rule.Metadata == nil || ds.unlimited || ds.override ||
				resp.GetStatuses()[i].GetCode() != rlsv3.RateLimitResponse_OK {
				continue
			}
			// A fresh copy per request: merging must never touch the rule's
			// own values, which every request shares.
			m, err := structpb.NewStruct(ds.rule.Metadata)
			if err != nil {
				continue // descriptors.Parse admits only what a Struct holds
			}
			if merged == nil {
				merged = m
				continue
			}
			mergeStruct(merged, m)
		}
		if merged != nil && len(merged.GetFields()) > 0 {
			fields["metadata"] = structpb.NewStructValue(merged)
		}
	}
	return &structpb.Struct{Fields: fields}
}

// mergeStruct adds to dst the fields of src it lacks; where both hold a
// mapping under one key, the mappings are merged the same way.
func mergeStruct(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = v
			continue
		}
		if ds, ss := have.GetStructValue(), v.GetStructValue(); ds != nil && ss != nil {
			mergeStruct(ds, ss)
		}
	}
}
