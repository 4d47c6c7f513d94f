package descriptors

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// load parses and builds one file, returning the first error.
func load(t *testing.T, name string, data []byte) (*Config, error) {
	t.Helper()
	f, err := Parse(name, data)
	if err != nil {
		return nil, err
	}
	return New([]*File{f}, Options{})
}

// TestInvalidFiles loads every testdata/invalid/*.yaml and checks the exact
// error lines. Every fixture must appear here, and vice versa.
func TestInvalidFiles(t *testing.T) {
	t.Parallel()
	tests := map[string][]string{
		"bad_yaml":                 {"bad_yaml.yaml:2: invalid YAML: did not find expected '-' indicator"},
		"bool_wrong":               {`bool_wrong.yaml:4:18: shadow_mode must be true or false, got "sometimes"`},
		"burst_overflow":           {"burst_overflow.yaml:4:61: burst is too large: 5000000000 (max 4294967295)"},
		"burst_without_global":     {"burst_without_global.yaml:5:14: burst needs unit and requests_per_unit"},
		"burst_zero":               {"burst_zero.yaml:4:62: rate_limit burst must be at least 1 when requests_per_unit is above 0"},
		"descriptors_not_list":     {"descriptors_not_list.yaml:3:3: descriptors must be a list"},
		"duplicate_key":            {`duplicate_key.yaml:5:10: duplicate descriptor key "a" (first at 3:10)`},
		"duplicate_key_value":      {`duplicate_key_value.yaml:8:10: duplicate descriptor key "a" value "v" (first at 3:10)`},
		"duplicate_nested":         {`duplicate_nested.yaml:8:14: duplicate descriptor key "user" (first at 6:14)`},
		"empty_domain":             {"empty_domain.yaml:1:9: domain is required and must not be empty"},
		"empty_file":               {"empty_file.yaml:1:1: empty file: domain is required"},
		"empty_key":                {"empty_key.yaml:3:10: descriptor key is required and must not be empty"},
		"empty_rate_limit":         {"empty_rate_limit.yaml:4:17: rate_limit needs unit and requests_per_unit, a local block, or unlimited: true"},
		"empty_replaces":           {"empty_replaces.yaml:8:17: replaces entry needs a non-empty name"},
		"key_not_string":           {"key_not_string.yaml:3:10: key must be a string"},
		"local_burst_zero":         {"local_burst_zero.yaml:5:58: local burst must be at least 1 when requests_per_unit is above 0"},
		"local_missing_unit":       {"local_missing_unit.yaml:5:14: local has requests_per_unit but no unit"},
		"local_with_unlimited":     {"local_with_unlimited.yaml:6:14: unlimited rate_limit must not have a local block"},
		"missing_domain":           {"missing_domain.yaml:1:1: domain is required and must not be empty"},
		"missing_key":              {"missing_key.yaml:3:5: descriptor key is required and must not be empty"},
		"missing_unit":             {"missing_unit.yaml:5:7: rate_limit has requests_per_unit but no unit"},
		"negative_burst":           {"negative_burst.yaml:4:61: burst must not be negative, got -1"},
		"negative_rpu":             {"negative_rpu.yaml:4:51: requests_per_unit must not be negative, got -5"},
		"path_collision":           {`path_collision.yaml:5:10: rule path "x.a_b" is also the path of the rule at path_collision.yaml:3:10`},
		"period_too_long":          {"period_too_long.yaml:4:47: rate_limit period 101 years is longer than 100 years"},
		"rate_limit_not_mapping":   {"rate_limit_not_mapping.yaml:4:17: rate_limit must be a mapping"},
		"refill_too_long":          {"refill_too_long.yaml:4:59: rate_limit takes more than 100 years to refill (burst 200 × year ÷ requests_per_unit 1)"},
		"root_not_mapping":         {"root_not_mapping.yaml:1:1: the file must be a mapping with domain and descriptors"},
		"rpu_float":                {`rpu_float.yaml:4:51: requests_per_unit must be a whole number, got "1.5"`},
		"rpu_huge":                 {"rpu_huge.yaml:4:51: requests_per_unit is too large: 123456789012345678901234567890 (max 4294967295)"},
		"rpu_not_number":           {`rpu_not_number.yaml:4:51: requests_per_unit must be a whole number, got "ten"`},
		"rpu_overflow":             {"rpu_overflow.yaml:4:51: requests_per_unit is too large: 4294967296 (max 4294967295)"},
		"self_replaces":            {`self_replaces.yaml:9:17: rate_limit "mine" must not replace itself`},
		"unit_multiplier_zero":     {"unit_multiplier_zero.yaml:4:49: unit_multiplier must be at least 1"},
		"unknown_field":            {`unknown_field.yaml:4:5: unknown field "vaule" in a descriptor (known: key, value, rate_limit,`},
		"unknown_field_rate_limit": {`unknown_field_rate_limit.yaml:7:7: unknown field "requests_per_second" in rate_limit`},
		"unknown_field_root":       {`unknown_field_root.yaml:2:1: unknown field "descriptor" in the file (known: domain, descriptors)`},
		"unknown_unit":             {`unknown_unit.yaml:4:24: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)`},
		"unlimited_with_burst":     {"unlimited_with_burst.yaml:4:42: unlimited rate_limit must not have burst"},
		"unlimited_with_unit":      {"unlimited_with_unit.yaml:6:13: unlimited rate_limit must not have a unit"},
		"share_threshold_without_wildcard": {
			"share_threshold_without_wildcard.yaml:5:22: share_threshold needs a wildcard value (one containing '*')",
		},
	}
	runFixtures(t, "testdata/invalid", tests, func(t *testing.T, path string, data []byte, want []string) {
		_, err := load(t, filepath.Base(path), data)
		if err == nil {
			t.Fatalf("load(%s) = nil error, want %q", path, want)
		}
		got := err.Error()
		if n := len(strings.Split(got, "\n")); n != len(want) {
			t.Errorf("load(%s) reported %d problems, want %d:\n%s", path, n, len(want), got)
		}
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("load(%s) error =\n%s\nwant it to contain\n%s", path, got, w)
			}
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("load(%s) error %T does not wrap *Error", path, err)
		}
	})
}

// TestAllProblemsAtOnce checks that one file with many problems reports
// every one of them, in file order.
func TestAllProblemsAtOnce(t *testing.T) {
	t.Parallel()
	const data = `domain: ""
descriptors:
  - key: a
    colour: red
    rate_limit: {unit: fortnight, requests_per_unit: -1, burst: 99999999999}
  - value: x
    rate_limit: {unlimited: true, unit: second}
  - key: a
  - key: b
    rate_limit:
      name: b
      unit: second
      requests_per_unit: 10
      burst: 0
      replaces: [{name: b}, {name: ""}]
      local: {unit: minute}
`
	want := []string{
		"many.yaml:1:9: domain is required and must not be empty",
		`many.yaml:4:5: unknown field "colour" in a descriptor`,
		`many.yaml:5:24: unknown unit "fortnight"`,
		"many.yaml:5:54: requests_per_unit must not be negative, got -1",
		"many.yaml:5:65: burst is too large: 99999999999",
		"many.yaml:6:5: descriptor key is required and must not be empty",
		"many.yaml:7:41: unlimited rate_limit must not have a unit",
		`many.yaml:8:10: duplicate descriptor key "a" (first at 3:10)`,
		"many.yaml:14:14: rate_limit burst must be at least 1",
		`many.yaml:15:25: rate_limit "b" must not replace itself`,
		"many.yaml:15:36: replaces entry needs a non-empty name",
		"many.yaml:16:14: local has a unit but no requests_per_unit",
	}
	_, err := Parse("many.yaml", []byte(data))
	if err == nil {
		t.Fatal("Parse(many.yaml) = nil error, want many")
	}
	got := strings.Split(err.Error(), "\n")
	if len(got) != len(want) {
		t.Errorf("Parse(many.yaml) reported %d problems, want %d:\n%s", len(got), len(want), err)
	}
	for i := range min(len(got), len(want)) {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d = %q, want prefix %q", i, got[i], want[i])
		}
	}
}

// runFixtures runs check as a parallel subtest for every dir/*.yaml,
// named after the file, with its content and its table entry; a fixture
// without an entry, or an entry without a fixture, fails t.
func runFixtures[V any](t *testing.T, dir string, table map[string]V, check func(t *testing.T, path string, data []byte, want V)) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]bool)
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".yaml")
		seen[name] = true
		want, ok := table[name]
		if !ok {
			t.Errorf("fixture %s has no entry in the table", path)
			continue
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			check(t, path, data, want)
		})
	}
	for name := range table {
		if !seen[name] {
			t.Errorf("table entry %q has no %s/%s.yaml", name, dir, name)
		}
	}
}
