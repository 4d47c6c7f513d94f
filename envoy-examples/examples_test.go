// Package examples tests the deployment files in envoy-examples/ and the
// repository's Dockerfile: every YAML file parses (all documents),
// Kubernetes objects are well formed and reference each other correctly,
// embedded sluice rules load with the real rule parser, container arguments
// parse with the real flag parser, Envoy configuration decodes into Envoy's
// own protos and passes their validation, and the monitoring files reference
// only the metrics docs/metrics.md documents. The package has no non-test code.
//
// integration/examples_test.go runs the promises written in envoy.yaml
// against a real sluice.
package examples

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	// Typed configurations that Any fields in the examples name: linked in
	// so that protojson can resolve them.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/adaptive_concurrency/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// yamlDocs returns every YAML document of a file, decoded into Go values
// (maps, slices, scalars). A file without a document is an error.
func yamlDocs(t *testing.T, path string) []any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []any
	for {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: document %d: %v", path, len(docs)+1, err)
		}
		if doc != nil { // a lone "---" or a comment-only document
			docs = append(docs, doc)
		}
	}
	if len(docs) == 0 {
		t.Fatalf("%s: no YAML document", path)
	}
	return docs
}

// jsonable converts a decoded YAML value for encoding/json: yaml.v3 gives
// map[any]any for mappings with non-string keys, which JSON cannot encode.
func jsonable(v any) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			c, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	case map[any]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("mapping key %v (%T) is not a string", k, k)
			}
			c, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			out[ks] = c
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			c, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	default:
		return v, nil
	}
}

// unmarshalProto decodes a YAML value into m through proto-JSON, as Envoy
// loads YAML: unknown fields are errors, and Any fields must name a linked
// type.
func unmarshalProto(v any, m proto.Message) error {
	c, err := jsonable(v)
	if err != nil {
		return err
	}
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return protojson.UnmarshalOptions{DiscardUnknown: false}.Unmarshal(data, m)
}

// validator is implemented by go-control-plane messages: the
// protoc-gen-validate rules of Envoy's API (required fields, ranges, ...).
type validator interface{ ValidateAll() error }

// validateProto runs Envoy's proto validation on m and on every message
// packed in an Any below it (which ValidateAll does not open), reporting
// each failure with where it was found.
func validateProto(t *testing.T, where string, m proto.Message) {
	t.Helper()
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			t.Errorf("%s: %T: %v", where, m, err)
		}
	}
	for _, inner := range packedMessages(t, where, m.ProtoReflect()) {
		validateProto(t, where+" → "+string(inner.ProtoReflect().Descriptor().FullName()), inner)
	}
}

// packedMessages returns the messages inside every Any field below m,
// unpacked, not descending into them.
func packedMessages(t *testing.T, where string, m protoreflect.Message) []proto.Message {
	t.Helper()
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			t.Errorf("%s: %s: %v", where, a.GetTypeUrl(), err)
			return nil
		}
		return []proto.Message{inner}
	}
	var out []proto.Message
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := range l.Len() {
				out = append(out, packedMessages(t, where, l.Get(i).Message())...)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				out = append(out, packedMessages(t, where, mv.Message())...)
				return true
			})
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
			out = append(out, packedMessages(t, where, v.Message())...)
		}
		return true
	})
	return out
}

// exampleFiles lists the files under envoy-examples/ whose names end in one
// of exts, as slash-separated paths relative to it.
func exampleFiles(t *testing.T, exts ...string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		for _, ext := range exts {
			if !d.IsDir() && strings.HasSuffix(path, ext) {
				files = append(files, filepath.ToSlash(path))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// repoFile reads a file of the repository, relative to its root.
func repoFile(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
