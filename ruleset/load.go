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
	"slices"
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
// file in a directory and its subdirectories (RuleFiles) — and builds the
// rule set, reading at
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
	// skipped are the files of the rules directories not named *.yaml or
	// *.yml: not read, but reported as warnings (envoyproxy/ratelimit
	// reads every file of its runtime directory).
	skipped []string
}

// readRuleSet reads every rule file the paths stand for, at most maxBytes
// in all. Every unreadable file or path is reported, not only the first.
func readRuleSet(paths []string, maxBytes int64) (*ruleSet, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxRuleBytes
	}
	var names, skipped []string
	var errs []error
	for _, path := range paths {
		n, sk, err := ruleFiles(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		names = append(names, n...)
		skipped = append(skipped, sk...)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	set := &ruleSet{names: names, skipped: skipped}
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
	for _, name := range s.skipped {
		opts.LoaderWarnings = append(slices.Clip(opts.LoaderWarnings), &descriptors.Error{File: name,
			Reason: "not named *.yaml or *.yml, so not read (envoyproxy/ratelimit reads every file of its runtime directory); rename it, or move it out of the rules directory"})
	}
	if len(errs) > 0 {
		// The files that parsed are built too, for their warnings only
		// (their errors could stem from the files missing).
		cfg, err := descriptors.New(files, opts)
		return nil, descriptors.WithWarnings(errors.Join(errs...), append(cfg.Warnings(), descriptors.WarningsOf(err)...))
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

// Bounds of the walk below a --config directory, so that a hostile or
// mistaken tree (a link to /, a million empty directories) cannot hang a
// load. envoyproxy/ratelimit's layout needs two levels
// (runtime/<app>/config/*.yaml).
const (
	// MaxRuleDepth is how many directory levels below --config are read.
	MaxRuleDepth = 8
	// MaxRuleDirs is how many directories one load reads, --config included.
	MaxRuleDirs = 1000
	// MaxRuleFiles is how many rule files one load reads.
	MaxRuleFiles = 10000
)

// RuleFiles lists the rule files path stands for, sorted: path itself when
// it is not a directory, else every *.yaml and *.yml file in it and in its
// subdirectories, as envoyproxy/ratelimit reads its runtime directory
// (runtime/<app>/config/*.yaml). Names that start with a dot are skipped,
// files and directories alike, so a Kubernetes ConfigMap volume's ..data
// directory and its timestamped twin are not read twice. Symlinks are
// followed (ConfigMap files and subdirectories are links into ..data); a
// directory reached twice (a link loop, two links to one directory) is read
// once. A dangling symlink with a rule file's name is listed, so that
// reading it fails instead of its rules silently disappearing. A tree
// deeper than MaxRuleDepth, or with more than MaxRuleDirs directories or
// MaxRuleFiles rule files, is an error.
func RuleFiles(path string) ([]string, error) {
	names, _, err := ruleFiles(path)
	return names, err
}

// ruleFiles is RuleFiles, also returning the files of the rules
// directories it skipped for their names (dot names aside), sorted.
func ruleFiles(path string) (names, skipped []string, err error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, nil, fmt.Errorf("rule config: %w", err)
	}
	if !info.IsDir() {
		return []string{path}, nil, nil
	}
	w := ruleWalk{seen: map[fileID]bool{}, bounds: defaultWalkBounds}
	if err := w.dir(path, info, 0); err != nil {
		return nil, nil, err
	}
	sort.Strings(w.names)
	sort.Strings(w.skipped)
	if len(w.names) == 0 {
		return nil, nil, fmt.Errorf("rule config: no *.yaml files in %s or its subdirectories", path)
	}
	return w.names, w.skipped, nil
}

// fileID identifies a directory whatever the path it is reached by.
type fileID struct{ dev, ino uint64 }

func idOf(st fs.FileInfo) (fileID, bool) {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{uint64(sys.Dev), uint64(sys.Ino)}, true
}

// walkBounds are the bounds of one walk: MaxRuleDepth, MaxRuleDirs and
// MaxRuleFiles, smaller in tests.
type walkBounds struct{ depth, dirs, files int }

var defaultWalkBounds = walkBounds{MaxRuleDepth, MaxRuleDirs, MaxRuleFiles}

// ruleWalk is one bounded walk of a rules directory tree.
type ruleWalk struct {
	names   []string
	skipped []string // other files, not read; at most bounds.files kept
	seen    map[fileID]bool
	dirs    int
	bounds  walkBounds
}

// dir lists the rule files of dir (depth levels below --config) and
// walks its subdirectories.
func (w *ruleWalk) dir(dir string, st fs.FileInfo, depth int) error {
	if id, ok := idOf(st); ok {
		if w.seen[id] {
			return nil
		}
		w.seen[id] = true
	}
	if w.dirs++; w.dirs > w.bounds.dirs {
		return fmt.Errorf("rule config: more than %d directories below the rules directory (at %s)", w.bounds.dirs, dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("rule config: %w", err)
	}
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, ".") {
			continue
		}
		full := filepath.Join(dir, n)
		if !e.IsDir() && e.Type()&fs.ModeSymlink == 0 {
			if isRuleFile(n) {
				if err := w.add(full); err != nil {
					return err
				}
			} else if e.Type().IsRegular() {
				w.skip(full)
			}
			continue
		}
		// A directory, or a symlink: follow it.
		st, err := os.Stat(full)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if isRuleFile(n) { // listed: readRuleFile reports the dangling link
				if err := w.add(full); err != nil {
					return err
				}
			}
		case err != nil:
			return fmt.Errorf("rule config: %w", err)
		case st.IsDir():
			if depth+1 > w.bounds.depth {
				return fmt.Errorf("rule config: %s is more than %d directory levels below the rules directory", full, w.bounds.depth)
			}
			if err := w.dir(full, st, depth+1); err != nil {
				return err
			}
		case isRuleFile(n):
			if err := w.add(full); err != nil {
				return err
			}
		case st.Mode().IsRegular():
			w.skip(full)
		}
	}
	return nil
}

func (w *ruleWalk) skip(name string) {
	if len(w.skipped) < w.bounds.files {
		w.skipped = append(w.skipped, name)
	}
}

func (w *ruleWalk) add(name string) error {
	if len(w.names) >= w.bounds.files {
		return fmt.Errorf("rule config: more than %d rule files", w.bounds.files)
	}
	w.names = append(w.names, name)
	return nil
}

func isRuleFile(name string) bool {
	ext := filepath.Ext(name)
	return ext == ".yaml" || ext == ".yml"
}
