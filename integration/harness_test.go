//go:build integration

package integration

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// rlsBinary is the rls binary built once by TestMain.
var rlsBinary string

// parallelTests is how many tests run at once when -parallel is not given.
// Every test owns its processes and ports and calls t.Parallel (but the
// fault tests that measure latency: doc.go); most of a
// test's time is waiting (for a process to start, for a load run or a
// fault to last its seconds), so four at once cut the package's wall time
// on a 2-core machine, where -parallel's default (GOMAXPROCS) runs two.
const parallelTests = 4

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", strconv.Itoa(max(parallelTests, runtime.GOMAXPROCS(0))))
	}
	dir, err := os.MkdirTemp("", "rls-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rlsBinary = filepath.Join(dir, "rls")
	build := exec.Command("go", "build", "-race", "-o", rlsBinary, "../cmd/rls")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building rls:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// startTimeout bounds how long a process may take to start listening, and
// nodes to count each other (their first heartbeats) on a loaded machine.
const startTimeout = 20 * time.Second

// rlsProcess is one running `rls serve`, owned by a test.
type rlsProcess struct {
	cmd       *exec.Cmd
	GRPCAddr  string
	HTTPAddr  string
	AdminAddr string // "off" with --admin-addr ""
	// MetricsAddr is --metrics-addr's listener, "off" without it.
	MetricsAddr string
	Conn        *grpc.ClientConn
	Client      rlsv3.RateLimitServiceClient

	mu     sync.Mutex
	log    strings.Builder
	exited chan struct{}
	err    error
}

var servingLine = regexp.MustCompile(`msg=serving grpc_addr=(\S+) http_addr=(\S+) admin_addr=(\S+) metrics_addr=(\S+)`)

// startRLS runs `rls serve` with args (plus loopback listeners on free
// ports) and waits until it logs its addresses. The process is killed at
// test cleanup if still running.
func startRLS(t *testing.T, args ...string) *rlsProcess {
	t.Helper()
	return startRLSEnv(t, nil, args...)
}

// rlsEnv is the environment of the rls processes the tests start: the
// machine's, which may hold envoyproxy/ratelimit's variables (REDIS_URL,
// PORT, ...) or KUBERNETES_SERVICE_HOST, made harmless (the tests say what
// they mean by flags), then extra ("NAME=value"; later ones win).
func rlsEnv(extra ...string) []string {
	// The race detector halts at a race, and does not wait its default
	// second at every exit of the binary (a race is still reported where
	// it happens).
	env := append(os.Environ(), "GORACE=halt_on_error=1 atexit_sleep_ms=0", "RLS_PEER_ENV=ignore", "KUBERNETES_SERVICE_HOST=")
	return append(env, extra...)
}

// startRLSEnv is startRLS with env added to rlsEnv's.
func startRLSEnv(t *testing.T, env []string, args ...string) *rlsProcess {
	t.Helper()
	full := append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, args...)
	cmd := exec.Command(rlsBinary, full...)
	cmd.Env = rlsEnv(env...)
	return startCmd(t, cmd)
}

// startCmd starts cmd, an rls that serves, and waits until it logs its
// addresses, as startRLS.
func startCmd(t *testing.T, cmd *exec.Cmd) *rlsProcess {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start rls: %v", err)
	}
	p := &rlsProcess{cmd: cmd, exited: make(chan struct{})}
	addrs := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.log.WriteString(line + "\n")
			p.mu.Unlock()
			if m := servingLine.FindStringSubmatch(line); m != nil {
				select {
				case addrs <- m[1:]:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("rls log:\n%s", p.Log())
		}
	})
	select {
	case a := <-addrs:
		p.GRPCAddr, p.HTTPAddr, p.AdminAddr, p.MetricsAddr = a[0], a[1], a[2], a[3]
	case <-p.exited:
		t.Fatalf("rls exited before serving: %v\n%s", p.err, p.Log())
	case <-time.After(startTimeout):
		t.Fatalf("rls did not log its addresses within %v:\n%s", startTimeout, p.Log())
	}
	conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	p.Conn, p.Client = conn, rlsv3.NewRateLimitServiceClient(conn)
	return p
}

// Log returns what the process has written to stderr so far.
func (p *rlsProcess) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// Signal sends sig to the process.
func (p *rlsProcess) Signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// Wait waits up to d for the process to exit and returns its error.
func (p *rlsProcess) Wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-p.exited:
		return p.err
	case <-time.After(d):
		t.Fatalf("rls still running after %v", d)
		return nil
	}
}

// Check sends one request of descriptors written as "k=v,k=v".
func (p *rlsProcess) Check(t *testing.T, domain string, descs ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := p.Client.ShouldRateLimit(context.Background(), request(domain, descs...))
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s %v): %v", domain, descs, err)
	}
	return resp
}

// HTTPGet fetches path from the HTTP port.
func (p *rlsProcess) HTTPGet(t *testing.T, path string) (int, string) {
	t.Helper()
	return httpGet(t, "http://"+p.HTTPAddr+path)
}

// AdminGet fetches path from the admin port (plaintext).
func (p *rlsProcess) AdminGet(t *testing.T, path string) (int, string) {
	t.Helper()
	return httpGet(t, "http://"+p.AdminAddr+path)
}

// PostJSON posts body to /json on the admin port (plaintext).
func (p *rlsProcess) PostJSON(t *testing.T, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+p.AdminAddr+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST /json: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func request(domain string, descs ...string) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: domain}
	for _, d := range descs {
		rd := &commonv3.RateLimitDescriptor{}
		for _, pair := range strings.Split(d, ",") {
			k, v, _ := strings.Cut(pair, "=")
			rd.Entries = append(rd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		req.Descriptors = append(req.Descriptors, rd)
	}
	return req
}

// runRLS runs a short rls command and returns its output and exit code.
func runRLS(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, rlsBinary, args...)
	cmd.Env = rlsEnv()
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("rls %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// writeFile writes content to dir/name and returns the path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
