package emergency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
)

// maxFileBytes bounds the digests file: a digest line is 65 bytes.
const maxFileBytes = 1 << 20

// Options configures a File.
type Options struct {
	Logger     *slog.Logger          // nil: discard
	Registerer prometheus.Registerer // nil: no metrics
}

// File is the set of accepted secrets read from a digests file
// (ParseDigests), re-read by Watch when the file changes. A bad file keeps
// the digests read before it. Its methods are safe for concurrent use;
// Match costs one atomic load beside the comparison.
type File struct {
	path string
	log  *slog.Logger
	cur  atomic.Pointer[Digests]

	mu   sync.Mutex        // serializes Reload
	last [sha256.Size]byte // digest of the file's bytes last loaded

	loadOK, loadErr prometheus.Counter
	count           prometheus.Gauge
}

// Open reads the digests file at path and returns it as a File. An
// unreadable or bad file is an error: the channel does not start without
// its secrets.
func Open(path string, opts Options) (*File, error) {
	f := &File{path: path, log: opts.Logger}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	loads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_emergency_secret_loads_total",
		Help: "Loads of the emergency secrets file (--emergency-secret-file), by result: success or error (the previous digests stay).",
	}, []string{"result"})
	f.loadOK, f.loadErr = loads.WithLabelValues("success"), loads.WithLabelValues("error")
	f.count = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ratelimit_emergency_secrets",
		Help: "Emergency secrets accepted now: the digests of the last good load of --emergency-secret-file.",
	})
	if err := f.Reload(); err != nil {
		return nil, err
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(loads); err != nil {
			return nil, fmt.Errorf("emergency metrics: %w", err)
		}
		if err := opts.Registerer.Register(f.count); err != nil {
			return nil, fmt.Errorf("emergency metrics: %w", err)
		}
	}
	return f, nil
}

// Match reports whether secret is accepted by the digests loaded last
// (Digests.Match).
func (f *File) Match(secret string) bool { return f.cur.Load().Match(secret) }

// Len returns the number of digests loaded last.
func (f *File) Len() int { return f.cur.Load().Len() }

// Reload reads the file again and, when its content changed and parses,
// swaps in its digests. On error the digests loaded before stay; the
// error is logged (without the file's content) and counted.
func (f *File) Reload() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, sum, err := f.read()
	if err != nil {
		f.loadErr.Inc()
		if f.cur.Load() != nil {
			f.log.Error("emergency secrets file rejected; the previous secrets stay", "path", f.path, "secrets", f.Len(), "err", err)
		}
		return err
	}
	if d == nil {
		return nil // unchanged
	}
	f.cur.Store(d)
	f.last = sum
	f.loadOK.Inc()
	f.count.Set(float64(d.Len()))
	f.log.Info("emergency secrets loaded", "path", f.path, "secrets", d.Len())
	return nil
}

// read reads and parses the file; nil digests when its content is the one
// loaded last.
func (f *File) read() (*Digests, [sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	fh, err := os.Open(f.path)
	if err != nil {
		return nil, sum, fmt.Errorf("emergency secrets: %w", err)
	}
	defer fh.Close()
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(fh, maxFileBytes+1))
	if err != nil {
		return nil, sum, fmt.Errorf("emergency secrets: reading %s: %w", f.path, err)
	}
	if n > maxFileBytes {
		return nil, sum, fmt.Errorf("emergency secrets: %s is larger than %d bytes", f.path, maxFileBytes)
	}
	sum = sha256.Sum256(buf.Bytes())
	if f.cur.Load() != nil && sum == f.last {
		return nil, sum, nil
	}
	d, err := ParseDigests(buf.Bytes())
	if err != nil {
		return nil, sum, fmt.Errorf("emergency secrets: %s: %w", f.path, err)
	}
	return d, sum, nil
}

// Watch re-reads the file whenever an entry of its directory, or of the
// directory its symlink points into, changes, until ctx is done. Watching
// directories rather than the file sees editors that replace the file and
// a Kubernetes Secret volume's ..data symlink swap. It returns an error
// only when it cannot watch at all.
func (f *File) Watch(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch emergency secrets: %w", err)
	}
	defer w.Close()
	dirs := map[string]bool{}
	follow := func() error {
		var errs []error
		for _, dir := range f.dirs() {
			if dirs[dir] {
				continue
			}
			if err := w.Add(dir); err != nil {
				errs = append(errs, err)
				continue
			}
			dirs[dir] = true
		}
		if len(dirs) == 0 {
			return fmt.Errorf("watch emergency secrets %s: no directory could be watched: %w", f.path, errors.Join(errs...))
		}
		return nil
	}
	if err := follow(); err != nil {
		return err
	}
	// A change between Open and the watches being in place sent no event.
	_ = f.Reload()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if !dirs[filepath.Dir(filepath.Clean(ev.Name))] {
				continue
			}
			_ = f.Reload() // logged and counted
			_ = follow()   // the symlink may point elsewhere now
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			f.log.Warn("watching emergency secrets", "path", f.path, "err", err)
		}
	}
}

// dirs returns the directories whose entries can change the file: its own
// and, when it is a symlink, its target's.
func (f *File) dirs() []string {
	abs, err := filepath.Abs(f.path)
	if err != nil {
		return nil
	}
	out := []string{filepath.Dir(abs)}
	if real, err := filepath.EvalSymlinks(abs); err == nil && filepath.Dir(real) != out[0] {
		out = append(out, filepath.Dir(real))
	}
	return out
}
