package config

import (
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/sluice-rls/sluice/descriptors"
)

// DefaultRulesName is the name the embedded example rule file reports in
// errors, logs and /rlconfig.
const DefaultRulesName = "embedded:default-rules.yaml"

//go:embed default-rules.yaml
var defaultRules []byte

// DefaultRules returns the embedded example rule file that `rls serve` uses
// when no --config is given.
func DefaultRules() []byte { return defaultRules }

// Load reads the rule files at path — one file, or every *.yaml and *.yml
// file directly inside a directory — and builds the rule set. An empty path
// loads the embedded example. Errors name file:line:column for each problem.
func Load(path string, opts descriptors.Options) (*descriptors.Config, error) {
	if path == "" {
		f, err := descriptors.Parse(DefaultRulesName, defaultRules)
		if err != nil {
			return nil, err
		}
		return descriptors.New([]*descriptors.File{f}, opts)
	}
	names, err := RuleFiles(path)
	if err != nil {
		return nil, err
	}
	var (
		files []*descriptors.File
		errs  []error
	)
	for _, name := range names {
		data, err := os.ReadFile(name)
		if err != nil {
			errs = append(errs, fmt.Errorf("read rule file: %w", err))
			continue
		}
		f, err := descriptors.Parse(name, data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		files = append(files, f)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return descriptors.New(files, opts)
}

// RuleFiles lists the rule files path stands for, sorted: path itself when it
// is a file, else the *.yaml and *.yml files directly inside it. Names that
// start with a dot are skipped, so a Kubernetes ConfigMap volume's ..data
// directory and its timestamped twin are not read twice.
func RuleFiles(path string) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("rule config: %w", err)
	}
	if !info.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("rule config: %w", err)
	}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !isRuleFile(n) {
			continue
		}
		full := filepath.Join(path, n)
		// Follow symlinks (ConfigMap files are links into ..data).
		if st, err := os.Stat(full); err != nil || st.IsDir() {
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("rule config: %w", err)
			}
			continue
		}
		names = append(names, full)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, fmt.Errorf("rule config: no *.yaml files in %s", path)
	}
	return names, nil
}

func isRuleFile(name string) bool {
	ext := filepath.Ext(name)
	return ext == ".yaml" || ext == ".yml"
}
