package override

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// Malformed is a stored entry that is not a valid override (its JSON does
// not decode, names another ID, or fails Validate): skipped, never applied,
// counted, and removable by its ID.
type Malformed struct {
	ID  string `json:"id"`
	Err string `json:"error"`
}

// Listing is what a Store holds.
type Listing struct {
	// Overrides are the entries that decode, expired ones included.
	Overrides []Override
	// Malformed are the entries that do not; one never hides the others.
	Malformed []Malformed
	// Generation counts the changes the store has seen: every Put and
	// Delete adds one, atomically with the change. 0: the store keeps no
	// count (a FileStore), or lost it with everything else (a Redis
	// restarted empty or flushed). A generation lower than one a node
	// applied before means the store lost changes (see Restorer).
	Generation int64
}

// Restorer is a Store that can be given back a table it lost.
type Restorer interface {
	// Restore replaces the store's overrides with list at generation gen
	// when, atomically, the store's generation is lower than gen; it
	// reports whether it did, and tells the other nodes.
	Restore(ctx context.Context, gen int64, list []Override) (bool, error)
}

// Store keeps the overrides every node applies. Implementations are safe
// for concurrent use: a FileStore for one node, override/redisstore for a
// fleet sharing a Redis.
type Store interface {
	// List returns every stored override, expired ones included, and the
	// entries that are not overrides.
	List(ctx context.Context) (Listing, error)
	// Put stores o, replacing the override with its ID, and tells the
	// other nodes.
	Put(ctx context.Context, o Override) error
	// Delete removes the override id and tells the other nodes; it
	// reports whether there was one.
	Delete(ctx context.Context, id string) (bool, error)
	// Watch calls changed whenever another node may have changed the
	// overrides, until ctx is done. A store whose changes all go through
	// this node returns when ctx is done.
	Watch(ctx context.Context, changed func()) error
	// Name says where overrides live, for logs and /healthcheck: "redis",
	// "file /path" or "memory".
	Name() string
}

// FileStore keeps one node's overrides in memory and, when it has a path,
// in a JSON file rewritten (atomically, by rename) on every change, so
// they survive restarts.
type FileStore struct {
	path string
	mu   sync.Mutex
	all  map[string]Override
}

// fileFormat is the file's JSON.
type fileFormat struct {
	Overrides []Override `json:"overrides"`
}

// OpenFile returns a FileStore persisted to path, reading the overrides it
// holds; a missing file holds none. An empty path keeps overrides in
// memory only.
func OpenFile(path string) (*FileStore, error) {
	s := &FileStore{path: path, all: make(map[string]Override)}
	if path == "" {
		return s, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("override file: %w", err)
	}
	var f fileFormat
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("override file %s: %w", path, err)
	}
	for _, o := range f.Overrides {
		s.all[o.ID] = o
	}
	return s, nil
}

// Name returns "file PATH", or "memory" without a path.
func (s *FileStore) Name() string {
	if s.path == "" {
		return "memory"
	}
	return "file " + s.path
}

// List returns every stored override.
func (s *FileStore) List(ctx context.Context) (Listing, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Listing{Overrides: s.list()}, nil
}

func (s *FileStore) list() []Override {
	out := make([]Override, 0, len(s.all))
	for _, o := range s.all {
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b Override) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Put stores o and rewrites the file; on a failed write nothing changes.
func (s *FileStore) Put(ctx context.Context, o Override) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.all[o.ID]
	s.all[o.ID] = o
	if err := s.write(); err != nil {
		if had {
			s.all[o.ID] = old
		} else {
			delete(s.all, o.ID)
		}
		return err
	}
	return nil
}

// Delete removes id and rewrites the file.
func (s *FileStore) Delete(ctx context.Context, id string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.all[id]
	if !had {
		return false, nil
	}
	delete(s.all, id)
	if err := s.write(); err != nil {
		s.all[id] = old
		return false, err
	}
	return true, nil
}

// Watch returns when ctx is done: every change goes through this node.
func (s *FileStore) Watch(ctx context.Context, changed func()) error {
	<-ctx.Done()
	return nil
}

// write replaces the file with the current overrides: a temporary file in
// the same directory, synced, then renamed over it.
func (s *FileStore) write() error {
	if s.path == "" {
		return nil
	}
	data, err := json.MarshalIndent(fileFormat{Overrides: s.list()}, "", "  ")
	if err != nil {
		return fmt.Errorf("override file: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.path), ".overrides-*")
	if err != nil {
		return fmt.Errorf("override file: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing to remove
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("override file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("override file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("override file: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		return fmt.Errorf("override file: %w", err)
	}
	return nil
}
