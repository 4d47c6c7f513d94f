package adaptive

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// yamlFields returns the YAML names of struct type t's fields.
func yamlFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// schemaNode is the part of a JSON schema these tests read.
type schemaNode struct {
	Properties map[string]*schemaNode `json:"properties"`
	Items      *schemaNode            `json:"items"`
}

func (n *schemaNode) names() []string {
	var out []string
	for k := range n.Properties {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestChartSchemaKnowsEveryField: the Helm chart's schema of
// adaptive.config names exactly the fields of the file, at every level, so
// that it neither refuses a field sluice reads nor lets through one sluice
// refuses.
func TestChartSchemaKnowsEveryField(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../charts/sluice/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var root schemaNode
	if err := json.Unmarshal(b, &root); err != nil {
		t.Fatal(err)
	}
	cfg := root.Properties["adaptive"].Properties["config"]
	pol := cfg.Properties["policies"].Items
	for _, c := range []struct {
		what   string
		schema *schemaNode
		typ    reflect.Type
	}{
		{"adaptive.config", cfg, reflect.TypeFor[Config]()},
		{"adaptive.config.policies[]", pol, reflect.TypeFor[Policy]()},
		{"adaptive.config.policies[].signals[]", pol.Properties["signals"].Items, reflect.TypeFor[Signal]()},
		{"adaptive.config.policies[].proportional", pol.Properties["proportional"], reflect.TypeFor[Proportional]()},
	} {
		if got, want := c.schema.names(), yamlFields(c.typ); !slices.Equal(got, want) {
			t.Errorf("chart schema of %s names %v, the file's fields are %v", c.what, got, want)
		}
	}
}

// TestChartReadmeExampleParses: the adaptive.config of the chart README's
// example is a file sluice loads.
func TestChartReadmeExampleParses(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../charts/sluice/README.md")
	if err != nil {
		t.Fatal(err)
	}
	var found int
	for _, m := range regexp.MustCompile("(?s)```yaml\n(adaptive:\n.*?)```").FindAllSubmatch(b, -1) {
		var vals struct {
			Adaptive struct {
				Config yaml.Node `yaml:"config"`
			} `yaml:"adaptive"`
		}
		if err := yaml.Unmarshal(m[1], &vals); err != nil {
			t.Fatal(err)
		}
		file, err := yaml.Marshal(&vals.Adaptive.Config)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(file); err != nil {
			t.Errorf("charts/sluice/README.md adaptive.config does not load: %v\n%s", err, file)
		}
		found++
	}
	if found == 0 {
		t.Fatal("charts/sluice/README.md has no adaptive: example")
	}
}
