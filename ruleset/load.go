package ruleset

import (
	"crypto/sha256"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/sluice-rls/sluice/descriptors"
)

// DefaultRulesName is the name the embedded example rule file reports in
// errors, logs and /rlconfig.
const DefaultRulesName = "embedded:default-rules.yaml"

// DefaultMaxRuleBytes is the default of --max-rule-bytes: the most bytes
// one load reads from all rule files together. Parsing needs several times
// the file size in memory, so the cap bounds what a rule set can cost.
const DefaultMaxRuleBytes = 16 << 20

// ErrRulesTooLarge is the error (wrapped, naming the file that crossed the
// cap) of a load whose rule files hold more than the cap.
var ErrRulesTooLarge = errors.New("rule files exceed --max-rule-bytes")

//go:embed default-rules.yaml
var defaultRules []byte

// DefaultRules returns the embedded example rule file that `rls serve` uses
// when no --config is given.
func DefaultRules() []byte { return defaultRules }

// Load reads the rule files at path — one file, or every *.yaml and *.yml
// file directly inside a directory — and builds the rule set, reading at
// most DefaultMaxRuleBytes. An empty path loads the embedded example. Errors
// name file:line:column for each problem.
func Load(path string, opts descriptors.Options) (*descriptors.Config, error) {
	return LoadLimited(path, opts, DefaultMaxRuleBytes)
}

// LoadLimited is Load reading at most maxBytes from all the rule files
// together (≤ 0: DefaultMaxRuleBytes). A rule file that cannot be read — a
// dangling symlink, a file that is not a regular file (FIFO, device,
// socket), a rule set over the cap — is an error naming the file: a load
// never silently leaves a file out.
func LoadLimited(path string, opts descriptors.Options, maxBytes int64) (*descriptors.Config, error) {
	if path == "" {
		return LoadPaths(nil, opts, maxBytes)
	}
	return LoadPaths([]string{path}, opts, maxBytes)
}

// LoadPaths is LoadLimited for several paths — each a file or a directory,
// as Load's path — loaded as one rule set: the set Load would build from
// one directory holding all their rule files, in the order of paths (so a
// domain defined twice is refused, naming the later file, unless
// opts.MergeDomains), and maxBytes caps them all together. No paths: the
// embedded example.
func LoadPaths(paths []string, opts descriptors.Options, maxBytes int64) (*descriptors.Config, error) {
	if len(paths) == 0 {
		f, err := descriptors.Parse(DefaultRulesName, defaultRules)
		if err != nil {
			return nil, err
		}
		return descriptors.New([]*descriptors.File{f}, opts)
	}
	set, err := readRuleSet(paths, maxBytes)
	if err != nil {
		return nil, err
	}
	return set.build(opts)
}

// ruleSet is the raw content of the rule files of one load.
type ruleSet struct {
	names []string
	data  [][]byte
}

// readRuleSet reads every rule file the paths stand for, at most maxBytes
// in all. Every unreadable file or path is reported, not only the first.
func readRuleSet(paths []string, maxBytes int64) (*ruleSet, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxRuleBytes
	}
	var names []string
	var errs []error
	for _, path := range paths {
		n, err := RuleFiles(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		names = append(names, n...)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	set := &ruleSet{names: names}
	left := maxBytes
	for _, name := range names {
		data, err := readRuleFile(name, left, maxBytes)
		if err != nil {
			errs = append(errs, err)
			if errors.Is(err, ErrRulesTooLarge) {
				break // the later files cannot fit either
			}
			continue
		}
		left -= int64(len(data))
		set.data = append(set.data, data)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return set, nil
}

// readRuleFile reads one rule file of at most left bytes (max is the whole
// cap, for the message). It refuses anything but a regular file before
// reading it: a FIFO would block the reader until a writer came, and a
// device such as /dev/zero never ends.
func readRuleFile(name string, left, max int64) ([]byte, error) {
	st, err := os.Stat(name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if target, lerr := os.Readlink(name); lerr == nil {
				return nil, fmt.Errorf("rule file %s: dangling symlink to %s: %w", name, target, err)
			}
		}
		return nil, fmt.Errorf("rule file %s: %w", name, err)
	}
	if err := regular(name, st); err != nil {
		return nil, err
	}
	// O_NONBLOCK: should the file have become a FIFO since the Stat, open
	// returns at once instead of waiting for a writer; the Stat of the open
	// file below then refuses it. It changes nothing for a regular file.
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("rule file %s: %w", name, err)
	}
	defer f.Close()
	if st, err = f.Stat(); err != nil {
		return nil, fmt.Errorf("rule file %s: %w", name, err)
	}
	if err := regular(name, st); err != nil {
		return nil, err
	}
	if st.Size() > left {
		return nil, fmt.Errorf("rule file %s: %d bytes: %w (%d bytes in all)", name, st.Size(), ErrRulesTooLarge, max)
	}
	// The file may grow after the Stat: read one byte past the cap at most.
	data, err := io.ReadAll(io.LimitReader(f, left+1))
	if err != nil {
		return nil, fmt.Errorf("rule file %s: %w", name, err)
	}
	if int64(len(data)) > left {
		return nil, fmt.Errorf("rule file %s: %w (%d bytes in all)", name, ErrRulesTooLarge, max)
	}
	return data, nil
}

// regular refuses a file that is not a regular file, saying what it is.
func regular(name string, st fs.FileInfo) error {
	m := st.Mode()
	if m.IsRegular() {
		return nil
	}
	kind := "special file"
	switch {
	case m&fs.ModeNamedPipe != 0:
		kind = "named pipe (FIFO)"
	case m&fs.ModeCharDevice != 0:
		kind = "character device"
	case m&fs.ModeDevice != 0:
		kind = "block device"
	case m&fs.ModeSocket != 0:
		kind = "socket"
	case m.IsDir():
		kind = "directory"
	}
	return fmt.Errorf("rule file %s: not a regular file: a %s", name, kind)
}

// build parses the files and builds the rule set; errors name the file.
func (s *ruleSet) build(opts descriptors.Options) (*descriptors.Config, error) {
	var (
		files []*descriptors.File
		errs  []error
	)
	for i, name := range s.names {
		f, err := descriptors.Parse(name, s.data[i])
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

// fingerprint identifies the content of a rule set, to tell whether the
// files changed between two reads.
func (s *ruleSet) fingerprint() [sha256.Size]byte { return Fingerprint(s.names, s.data) }

// Fingerprint is the SHA-256 that identifies a rule set made of the files
// names holding data (data[i] is the content of names[i]): every name and
// content, each length-prefixed. A reload's audit event carries it, in hex,
// as its Subject.
func Fingerprint(names []string, data [][]byte) [sha256.Size]byte {
	h := sha256.New()
	for i, name := range names {
		fmt.Fprintf(h, "%d:%s:%d:", len(name), name, len(data[i]))
		h.Write(data[i])
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// RuleFiles lists the rule files path stands for, sorted: path itself when it
// is not a directory, else the *.yaml and *.yml entries directly inside it
// that are not directories. Names that start with a dot are skipped, so a
// Kubernetes ConfigMap volume's ..data directory and its timestamped twin
// are not read twice. A dangling symlink is listed, so that reading it fails
// instead of its rules silently disappearing.
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
		st, err := os.Stat(full)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// Listed: readRuleFile reports the dangling link.
		case err != nil:
			return nil, fmt.Errorf("rule config: %w", err)
		case st.IsDir():
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
