package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/node"
	"github.com/sluice-rls/sluice/service"
)

// errOverLimit is check's answer OVER_LIMIT, already printed: exit 1.
var errOverLimit = errors.New("over limit")

// checkError is a check that got no decision (connection, TLS, a call
// error or an answer other than OK and OVER_LIMIT): exit 2, as for a usage
// error, so that 1 always means OVER_LIMIT.
type checkError struct{ err error }

func (e checkError) Error() string { return e.err.Error() }
func (e checkError) Unwrap() error { return e.err }

const checkUsage = `usage: rls check [flags] KEY=VALUE[,KEY=VALUE]...  (one argument per descriptor)

Exit status: 0 OK, 1 OVER_LIMIT, 2 error (usage, connection, TLS, no decision).
TLS: --tls-ca (or --tls-cert) switches to TLS and verifies the server;
--tls-cert and --tls-key present a client certificate (mTLS).

`

// check asks a running server for one decision and prints it: the overall
// code, one line per descriptor and the headers the server adds. It
// returns nil on OK, errOverLimit on OVER_LIMIT, errUsage or a checkError
// otherwise.
func check(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "gRPC address of the server")
	domain := fs.String("domain", "edge", "rate-limit domain")
	hits := fs.Uint("hits", 0, "hits_addend of the request (0 = 1)")
	timeout := fs.Duration("timeout", 2*time.Second, "deadline of the call")
	secretKey := fs.String("emergency-key", cmp.Or(getenv(flags.EnvName("emergency-key")), "emergency"), "descriptor key whose values are never printed: the server's --emergency-key (default: $RLS_EMERGENCY_KEY, else emergency)")
	var tf checkTLSFlags
	tf.register(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, checkUsage)
		fs.PrintDefaults()
	}
	if err := flags.ParseInterspersed(fs, args); errors.Is(err, flag.ErrHelp) {
		return nil // -h printed the usage, as asked
	} else if err != nil {
		return errUsage
	}
	if err := tf.validate(); err != nil {
		fmt.Fprintln(stderr, "rls check:", err)
		return errUsage
	}
	if *hits > math.MaxUint32 {
		fmt.Fprintf(stderr, "rls check: --hits %d: at most %d\n", *hits, uint32(math.MaxUint32))
		return errUsage
	}
	req := &rlsv3.RateLimitRequest{Domain: *domain, HitsAddend: uint32(*hits)}
	for _, arg := range fs.Args() {
		d, err := service.ParseDescriptor(arg)
		if err != nil {
			fmt.Fprintln(stderr, "rls check:", err)
			return errUsage
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	if len(req.Descriptors) == 0 {
		fs.Usage()
		return errUsage
	}
	creds, err := tf.credentials()
	if err != nil {
		return checkError{err}
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return checkError{fmt.Errorf("connect to %s: %w", *addr, err)}
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil {
		return checkError{fmt.Errorf("ShouldRateLimit on %s: %w", *addr, err)}
	}
	printResponse(stdout, req.GetDescriptors(), *secretKey, resp)
	if noLimit(resp) {
		fmt.Fprintf(stderr, "rls check: no rule of domain %q matched: is the domain right (--domain, default edge)? /rlconfig on the server's HTTP address lists its rules\n", *domain)
	}
	switch resp.GetOverallCode() {
	case rlsv3.RateLimitResponse_OK:
		return nil
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		return errOverLimit
	}
	return checkError{fmt.Errorf("%s answered %s, neither OK nor OVER_LIMIT", *addr, resp.GetOverallCode())}
}

// checkTLSFlags are rls check's --tls-* flags.
type checkTLSFlags struct{ ca, cert, key, serverName string }

func (f checkTLSFlags) enabled() bool { return f.ca != "" || f.cert != "" }

// register defines --tls-ca, --tls-cert, --tls-key and --tls-server-name,
// the client TLS flags of rls check, usage and override.
func (f *checkTLSFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.ca, "tls-ca", "", "PEM bundle of the CAs to verify the server with (default with --tls-cert: the system roots)")
	fs.StringVar(&f.cert, "tls-cert", "", "PEM client certificate to present (mTLS; needs --tls-key)")
	fs.StringVar(&f.key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&f.serverName, "tls-server-name", "", "name the server certificate must carry (default: the host of --addr)")
}

// validate reports flags that cannot go together.
func (f checkTLSFlags) validate() error {
	if (f.cert == "") != (f.key == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if f.serverName != "" && !f.enabled() {
		return errors.New("--tls-server-name needs --tls-ca or --tls-cert")
	}
	return nil
}

// credentials returns plaintext without --tls-ca and --tls-cert, else TLS
// verifying the server (against --tls-ca, or the system roots) and
// presenting --tls-cert when set.
func (f checkTLSFlags) credentials() (credentials.TransportCredentials, error) {
	if !f.enabled() {
		return insecure.NewCredentials(), nil
	}
	cfg, err := f.config()
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

// config is the client TLS configuration the flags ask for (f.enabled()).
func (f checkTLSFlags) config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.serverName}
	if f.ca != "" {
		pool, err := node.LoadCertPool(f.ca)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		cfg.RootCAs = pool
	}
	if f.cert != "" {
		pair, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// noLimit reports an OK answer in which no descriptor met a limit: what a
// domain without rules, or descriptors no rule matches, get.
func noLimit(resp *rlsv3.RateLimitResponse) bool {
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		return false
	}
	for _, st := range resp.GetStatuses() {
		if st.GetCurrentLimit() != nil {
			return false
		}
	}
	return true
}

// printResponse prints the answer to the descriptors ds, the values of
// secretKey's entries hidden.
func printResponse(w io.Writer, ds []*ratelimitv3.RateLimitDescriptor, secretKey string, resp *rlsv3.RateLimitResponse) {
	fmt.Fprintln(w, resp.GetOverallCode())
	for i, st := range resp.GetStatuses() {
		desc := "?"
		if i < len(ds) {
			desc = descriptorString(ds[i], secretKey)
		}
		line := fmt.Sprintf("  %s: %s", desc, st.GetCode())
		if l := st.GetCurrentLimit(); l != nil {
			unit := strings.ToLower(l.GetUnit().String())
			if m := l.GetUnitMultiplier().GetValue(); m > 1 {
				unit = fmt.Sprintf("%d %ss", m, unit)
			}
			line += fmt.Sprintf(", limit %d/%s", l.GetRequestsPerUnit(), unit)
			if l.GetName() != "" {
				line += " (" + l.GetName() + ")"
			}
			line += fmt.Sprintf(", remaining %d, full in %v", st.GetLimitRemaining(), flags.FormatDuration(st.GetDurationUntilReset().AsDuration()))
		} else {
			line += ", no limit"
		}
		fmt.Fprintln(w, line)
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		fmt.Fprintf(w, "  header %s: %s\n", h.GetKey(), h.GetValue())
	}
	if len(resp.GetRawBody()) > 0 {
		fmt.Fprintf(w, "  body %s\n", resp.GetRawBody())
	}
}

// descriptorString is d as rls check takes it, key=value,..., with the
// values of secretKey's entries replaced by ***.
func descriptorString(d *ratelimitv3.RateLimitDescriptor, secretKey string) string {
	parts := make([]string, len(d.GetEntries()))
	for i, e := range d.GetEntries() {
		v := e.GetValue()
		if e.GetKey() == secretKey {
			v = "***"
		}
		parts[i] = e.GetKey() + "=" + v
	}
	return strings.Join(parts, ",")
}
