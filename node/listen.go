package node

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"
)

// listeners are a node's listeners, opened by listen.
type listeners struct {
	grpc, http net.Listener
	admin      net.Listener // nil: --admin-addr is empty
	metrics    net.Listener // nil: --metrics-addr is empty
}

// listen opens the gRPC, HTTP, metrics and admin listeners of st, or
// none: on an error those already open are closed. An admin address the
// options do not allow to be reached (checkAdminAddr) is an error too.
func listen(st Options, log *slog.Logger) (listeners, error) {
	var l listeners
	var err error
	if l.grpc, err = Listen(st.GRPCAddr); err != nil {
		return listeners{}, fmt.Errorf("gRPC listener: %w", err)
	}
	if l.http, err = Listen(st.HTTPAddr); err != nil {
		l.close()
		return listeners{}, fmt.Errorf("HTTP listener: %w", err)
	}
	if st.MetricsAddr != "" {
		if l.metrics, err = Listen(st.MetricsAddr); err != nil {
			l.close()
			return listeners{}, fmt.Errorf("metrics listener: %w", err)
		}
	}
	if st.AdminAddr == "" {
		return l, nil
	}
	if l.admin, err = Listen(st.AdminAddr); err != nil {
		l.close()
		return listeners{}, fmt.Errorf("admin listener: %w", err)
	}
	if err := checkAdminAddr(st, l.admin.Addr(), log); err != nil {
		l.close()
		return listeners{}, err
	}
	return l, nil
}

// close closes the listeners that are open.
func (l listeners) close() {
	for _, lis := range []net.Listener{l.grpc, l.http, l.admin, l.metrics} {
		if lis != nil {
			lis.Close()
		}
	}
}

// addrs are the listeners' addresses.
func (l listeners) addrs() Addrs {
	a := Addrs{GRPC: l.grpc.Addr(), HTTP: l.http.Addr()}
	if l.admin != nil {
		a.Admin = l.admin.Addr()
	}
	if l.metrics != nil {
		a.Metrics = l.metrics.Addr()
	}
	return a
}

// socketMode is the permission of a unix socket rls serve creates: owner
// and group may connect (connecting needs write permission), others not.
// Share the group with the client, e.g. a Kubernetes pod's fsGroup on the
// volume holding the socket.
const socketMode fs.FileMode = 0o660

// UnixPath returns the socket path of a unix: address, in grpc-go's target
// syntax: unix:path (relative or absolute) or unix:///absolute/path. ok is
// false for any other address (host:port).
func UnixPath(addr string) (path string, ok bool, err error) {
	rest, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		return "", false, nil
	}
	if after, ok := strings.CutPrefix(rest, "//"); ok {
		// unix://authority/path: grpc-go accepts only an empty authority.
		if !strings.HasPrefix(after, "/") {
			return "", true, fmt.Errorf("%q: want unix:path or unix:///absolute/path", addr)
		}
		rest = after
	}
	if rest == "" {
		return "", true, fmt.Errorf("%q: empty socket path", addr)
	}
	return rest, true, nil
}

// Listen opens a TCP listener on host:port, or a unix socket for unix:path
// or unix:///path. A socket file left at the path by a process that died
// is removed first; anything else there (a regular file, a socket another
// process serves on) is an error, never deleted. The socket gets
// socketMode, and closing the listener removes it.
func Listen(addr string) (net.Listener, error) {
	path, ok, err := UnixPath(addr)
	if err != nil {
		return nil, err
	}
	if !ok {
		return net.Listen("tcp", addr)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, socketMode); err != nil {
		lis.Close()
		return nil, fmt.Errorf("socket permissions: %w", err)
	}
	return lis, nil // a *net.UnixListener from Listen unlinks its file on Close
}

// staleDialTimeout bounds the dial that tells a live socket from a stale one.
const staleDialTimeout = time.Second

// removeStaleSocket removes the socket file at path when no process accepts
// connections on it.
func removeStaleSocket(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket: not removed", path)
	}
	if c, err := net.DialTimeout("unix", path, staleDialTimeout); err == nil {
		c.Close()
		return fmt.Errorf("%s: another process is serving on this socket", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("removing stale socket: %w", err)
	}
	return nil
}

// isLoopback reports whether addr is reachable from this host alone: a
// TCP address on a loopback IP, or a unix socket.
func isLoopback(addr net.Addr) bool {
	switch a := addr.(type) {
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UnixAddr:
		return true
	}
	return false
}
