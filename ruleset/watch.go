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

// newWatchSet resolves path — and, when it is a directory, each rule file in
// it — and returns the directories to watch: the directory holding each
// symlink met on the way (for the link's name), the directory holding the
// path itself (for its name, so that replacing the directory is seen), the
// rules directory (for any rule file) and the directory really holding
// each rule file (for its name). A path that does not exist (yet) is
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
			s.dir(real).rules = true
			entries, _ := os.ReadDir(real) // unreadable: the load reports it
			for _, e := range entries {
				if n := e.Name(); !strings.HasPrefix(n, ".") && isRuleFile(n) {
					_, _ = s.resolve(filepath.Join(real, n)) // dangling: watched for; the load reports it
				}
			}
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
	return d.names[base] || d.rules && !strings.HasPrefix(base, ".") && isRuleFile(base)
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
