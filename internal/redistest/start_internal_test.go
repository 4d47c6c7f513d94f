package redistest

import (
	"net"
	"testing"
)

// TestStartRetriesTakenPort: a port taken between its choice and the
// server's bind costs a try, not the test, for clusters' chosen ports too
// (a node's bus port taken by another test's server on a busy machine made
// StartCluster fail with "exited during start").
func TestStartRetriesTakenPort(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	tries := 0
	s := Start(t, withPortFrom(func() (int, error) {
		tries++
		if tries == 1 {
			return taken, nil
		}
		return freePort()
	}))
	if tries != 2 || s.Port() == taken {
		t.Errorf("Start after a taken port: %d tries, port %d (taken %d); want a second try on another port", tries, s.Port(), taken)
	}
}
