package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// check asks a running server for one decision and prints it: the overall
// code, one line per descriptor and the headers the server adds.
func check(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "gRPC address of the server")
	domain := fs.String("domain", "edge", "rate-limit domain")
	hits := fs.Uint("hits", 0, "hits_addend of the request (0 = 1)")
	timeout := fs.Duration("timeout", 2*time.Second, "deadline of the call")
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: rls check [flags] KEY=VALUE[,KEY=VALUE]...  (one argument per descriptor)\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	req := &rlsv3.RateLimitRequest{Domain: *domain, HitsAddend: uint32(*hits)}
	for _, arg := range fs.Args() {
		d, err := parseDescriptor(arg)
		if err != nil {
			return err
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	if len(req.Descriptors) == 0 {
		fs.Usage()
		return errUsage
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", *addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil {
		return fmt.Errorf("ShouldRateLimit on %s: %w", *addr, err)
	}
	printResponse(stdout, fs.Args(), resp)
	return nil
}

// parseDescriptor turns "k=v,k2=v2" into a descriptor.
func parseDescriptor(arg string) (*commonv3.RateLimitDescriptor, error) {
	d := &commonv3.RateLimitDescriptor{}
	for _, pair := range strings.Split(arg, ",") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("descriptor %q: want KEY=VALUE[,KEY=VALUE]", arg)
		}
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d, nil
}

func printResponse(w io.Writer, args []string, resp *rlsv3.RateLimitResponse) {
	fmt.Fprintln(w, resp.GetOverallCode())
	for i, st := range resp.GetStatuses() {
		line := fmt.Sprintf("  %s: %s", args[i], st.GetCode())
		if l := st.GetCurrentLimit(); l != nil {
			unit := strings.ToLower(l.GetUnit().String())
			if m := l.GetUnitMultiplier().GetValue(); m > 1 {
				unit = fmt.Sprintf("%d %ss", m, unit)
			}
			line += fmt.Sprintf(", limit %d/%s", l.GetRequestsPerUnit(), unit)
			if l.GetName() != "" {
				line += " (" + l.GetName() + ")"
			}
			line += fmt.Sprintf(", remaining %d, full in %v", st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration())
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
