package ruleset

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// maxLinks bounds the symlinks followed while resolving one path, as the
// kernel does (Linux: 40), so that a link loop ends.
const maxLinks = 40

// watchDir is one directory the watcher watches, and which of its entries
// can change the rules.
type watchDir struct {
	names map[string]bool // symlinks on the way to the rules, and the rule paths themselves
	rules bool            // the rules directory: any *.yaml / *.yml entry
	info  fs.FileInfo     // the directory when the set was built, to notice a swap
}

// watchSet is every directory to watch for one --config path, by real
// (symlink-free) path. It is rebuilt before every load: a swapped symlink or
// a renamed directory changes it, and the watcher follows.
type watchSet map[string]*watchDir

// newWatchSet resolves path — and, when it is a directory, each rule file
// and subdirectory in it, recursively, as RuleFiles reads them — and
// returns the directories to watch: the directory holding each symlink met
// on the way (for the link's name), the directory holding the path itself
// (for its name, so that replacing the directory is seen), the rules
// directory and each subdirectory (for any rule file, and for new
// subdirectories) and the directory really holding each rule file (for its
// name). fsnotify does not watch subdirectories: each is a watch of its own. A path that does not exist (yet) is
// watched for in the deepest directory that does.
func newWatchSet(path string) watchSet {
	s := watchSet{}
	abs, err := filepath.Abs(path)
	if err != nil {
		return s
	}
	real, err := s.resolve(abs)
	if err == nil {
		if st, err := os.Stat(real); err == nil && st.IsDir() {
			s.rulesDir(real, st, 0, map[fileID]bool{})
		}
	}
	for dir, d := range s {
		st, err := os.Stat(dir)
		if err != nil || !st.IsDir() {
			delete(s, dir)
			continue
		}
		d.info = st
	}
	return s
}

// rulesDir adds the rules directory real (a real path, depth levels below
// --config) and, as RuleFiles reads them, its subdirectories, within the
// same bounds (beyond them the load fails and reports it). Each rule file
// and each subdirectory is resolved: the links on the way are watched, and
// a subdirectory's name too, so that its removal or replacement is seen.
func (s watchSet) rulesDir(real string, st fs.FileInfo, depth int, seen map[fileID]bool) {
	if id, ok := idOf(st); ok {
		if seen[id] {
			return
		}
		seen[id] = true
	}
	if len(seen) > MaxRuleDirs {
		return
	}
	s.dir(real).rules = true
	entries, _ := os.ReadDir(real) // unreadable: the load reports it
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, ".") {
			continue
		}
		full := filepath.Join(real, n)
		if isRuleFile(n) && !e.IsDir() {
			_, _ = s.resolve(full) // dangling: watched for; the load reports it
			if e.Type()&fs.ModeSymlink == 0 {
				continue
			}
		}
		if !e.IsDir() && e.Type()&fs.ModeSymlink == 0 || depth+1 > MaxRuleDepth {
			continue
		}
		sub, err := s.resolve(full)
		if err != nil {
			continue
		}
		if sst, err := os.Stat(sub); err == nil && sst.IsDir() {
			s.dir(real).names[n] = true
			s.rulesDir(sub, sst, depth+1, seen)
		}
	}
}

func (s watchSet) dir(dir string) *watchDir {
	d := s[dir]
	if d == nil {
		d = &watchDir{names: map[string]bool{}}
		s[dir] = d
	}
	return d
}

// resolve follows the symlinks of the absolute path abs component by
// component, recording in s the directory and name of every link it meets
// and of the final component, and returns the real path. It stops at the
// first component that does not exist, recording where it would appear.
//
// filepath.EvalSymlinks does the same resolution but returns only the end
// result; the links it passes through are what must be watched, since
// swapping any of them (a ConfigMap's ..data, a release's current) changes
// the rules without touching the files.
func (s watchSet) resolve(abs string) (string, error) {
	real := filepath.VolumeName(abs) + string(filepath.Separator)
	todo := abs[len(real):]
	links := 0
	for todo != "" {
		comp, rest, _ := strings.Cut(todo, string(filepath.Separator))
		todo = rest
		switch comp {
		case "", ".":
			continue
		case "..":
			real = filepath.Dir(real)
			continue
		}
		next := filepath.Join(real, comp)
		if todo == "" {
			s.dir(real).names[comp] = true // the path itself
		}
		st, err := os.Lstat(next)
		if err != nil {
			s.dir(real).names[comp] = true // watch for it to appear
			return "", err
		}
		if st.Mode()&fs.ModeSymlink == 0 {
			real = next
			continue
		}
		s.dir(real).names[comp] = true
		if links++; links > maxLinks {
			return "", fmt.Errorf("%s: too many levels of symbolic links", abs)
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			real = filepath.VolumeName(target) + string(filepath.Separator)
			target = target[len(real):]
		}
		if todo != "" {
			target += string(filepath.Separator) + todo
		}
		todo = target
	}
	return real, nil
}

// concerns reports whether an event on name can change the rules.
func (s watchSet) concerns(name string) bool {
	name = filepath.Clean(name)
	if _, ok := s[name]; ok {
		return true // a watched directory itself was removed or moved
	}
	d := s[filepath.Dir(name)]
	if d == nil {
		return false
	}
	base := filepath.Base(name)
	if d.names[base] {
		return true
	}
	if !d.rules || strings.HasPrefix(base, ".") {
		return false
	}
	if isRuleFile(base) {
		return true
	}
	// A new subdirectory (or a link to one) of a rules directory: the
	// reload that follows watches it and reads its rule files.
	st, err := os.Stat(name)
	return err == nil && st.IsDir()
}

// sameDirs reports whether s and o watch the very same directories (same
// paths, same files: a directory replaced under its name is a change).
func (s watchSet) sameDirs(o watchSet) bool {
	if len(s) != len(o) {
		return false
	}
	for dir, d := range s {
		od := o[dir]
		if od == nil || !os.SameFile(d.info, od.info) {
			return false
		}
	}
	return true
}

// dirs lists the watched directories, sorted, for logs.
func (s watchSet) dirs() []string {
	out := make([]string, 0, len(s))
	for dir := range s {
		out = append(out, dir)
	}
	sort.Strings(out)
	return out
}

// errNothingToWatch is Watch's error when not one directory could be watched.
var errNothingToWatch = errors.New("no directory of the rules could be watched")
