package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/node"
	"github.com/sluice-rls/sluice/service"
)

const usageUsage = `usage: rls usage [flags] --domain D KEY=VALUE[,KEY=VALUE]...  (one argument per descriptor)
       rls usage [flags] --top [--domain D] [--rule PATH] [--minutes M]

Reads a running server's admin address (--admin-addr): for each descriptor,
its rule and, per layer, the limit, the tokens left now, the share of the
burst in use (taken, not yet refilled: the tenant's utilisation now) and
the time until the bucket is full, without spending a token (GET /usage);
or, with --top,
the values refused most per rule over the last minutes (GET /usage/top).
Exit status: 0 answered, 2 error (usage, connection, TLS, an error answer).
TLS: --tls-ca (or --tls-cert) switches to HTTPS and verifies the server;
--tls-cert and --tls-key present a client certificate (mTLS).

`

// usageCmd asks a running server's admin address for /usage or
// /usage/top and prints the answer. It returns nil once an answer is
// printed, errUsage or a checkError (exit 2) otherwise.
func usageCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("usage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8082", "admin address of the server (--admin-addr): host:port or unix:path")
	domain := fs.String("domain", "", "rate-limit domain (required without --top)")
	top := fs.Bool("top", false, "print the values refused most per rule instead (GET /usage/top)")
	rule := fs.String("rule", "", "with --top: only this rule (its path, as in /rlconfig)")
	minutes := fs.Int("minutes", service.TopRefusedMinutes, fmt.Sprintf("with --top: the last this many minutes, 1 to %d", service.TopRefusedMinutes))
	asJSON := fs.Bool("json", false, "print the server's JSON answer as it is")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline of the call")
	var tf checkTLSFlags
	tf.register(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageUsage)
		fs.PrintDefaults()
	}
	if err := flags.ParseInterspersed(fs, args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return errUsage
	}
	fail := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "rls usage: "+format+"\n", a...)
		return errUsage
	}
	if err := tf.validate(); err != nil {
		return fail("%v", err)
	}
	q := url.Values{}
	path := "/usage"
	if *top {
		if fs.NArg() > 0 {
			return fail("--top takes no descriptors (got %q)", fs.Arg(0))
		}
		if *minutes < 1 || *minutes > service.TopRefusedMinutes {
			return fail("--minutes must be from 1 to %d, not %d", service.TopRefusedMinutes, *minutes)
		}
		path = "/usage/top"
		setIf(q, "domain", *domain)
		setIf(q, "rule", *rule)
		q.Set("minutes", strconv.Itoa(*minutes))
	} else {
		if *domain == "" {
			return fail("--domain is required")
		}
		if *rule != "" {
			return fail("--rule goes with --top")
		}
		if fs.NArg() == 0 {
			fs.Usage()
			return errUsage
		}
		q.Set("domain", *domain)
		for _, arg := range fs.Args() {
			if _, err := service.ParseDescriptor(arg); err != nil {
				return fail("%v", err)
			}
			q.Add("descriptor", arg)
		}
	}
	client, base, err := tf.httpClient(*addr)
	if err != nil {
		return checkError{err}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	u := base + path + "?" + q.Encode()
	body, err := fetch(ctx, client, u)
	if err != nil {
		return checkError{err}
	}
	if *asJSON {
		_, err = stdout.Write(body)
		return err
	}
	if *top {
		var ans service.TopRefusedAnswer
		if err := json.Unmarshal(body, &ans); err != nil {
			return checkError{fmt.Errorf("reading the answer of %s: %w", path, err)}
		}
		printTop(stdout, ans)
		return nil
	}
	var ans service.Usage
	if err := json.Unmarshal(body, &ans); err != nil {
		return checkError{fmt.Errorf("reading the answer of %s: %w", path, err)}
	}
	printUsage(stdout, ans)
	return nil
}

func setIf(q url.Values, k, v string) {
	if v != "" {
		q.Set(k, v)
	}
}

// fetch GETs u and returns the body of a 200 answer; any other status is
// an error carrying the server's message.
func fetch(ctx context.Context, client *http.Client, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", req.URL.Redacted(), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading the answer: %w", req.URL.Path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", req.URL.Path, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// httpClient returns a client for the admin address addr (host:port, or
// unix:path as rls serve takes it) and the base of its URLs: plain HTTP
// without --tls-ca and --tls-cert, else HTTPS configured as credentials
// configures gRPC.
func (f checkTLSFlags) httpClient(addr string) (*http.Client, string, error) {
	tr := &http.Transport{}
	host := addr
	if path, ok, err := node.UnixPath(addr); err != nil {
		return nil, "", fmt.Errorf("--addr: %w", err)
	} else if ok {
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		}
		host = "localhost"
	}
	if !f.enabled() {
		return &http.Client{Transport: tr}, "http://" + host, nil
	}
	cfg, err := f.config()
	if err != nil {
		return nil, "", err
	}
	tr.TLSClientConfig = cfg
	return &http.Client{Transport: tr}, "https://" + host, nil
}

// printUsage writes a Usage answer, one block per descriptor.
func printUsage(w io.Writer, u service.Usage) {
	head := "domain " + u.Domain
	if u.Gray {
		head += " (gray: doubled local limits)"
	}
	fmt.Fprintln(w, head)
	for _, d := range u.Descriptors {
		line := "  " + d.Descriptor + ": "
		switch {
		case d.Rule != nil:
			line += "rule " + ruleText(d.Rule)
		case d.Replaced != nil:
			line += "no rule: its rule " + ruleText(d.Replaced) + " is replaced by another descriptor's"
		default:
			line += "no rule"
		}
		var marks []string
		if d.Unlimited {
			marks = append(marks, "unlimited")
		}
		if d.Shadow {
			marks = append(marks, "shadow mode")
		}
		if d.Quota {
			marks = append(marks, "quota")
		}
		if len(marks) > 0 {
			line += ", " + strings.Join(marks, ", ")
		}
		fmt.Fprintln(w, line)
		for _, l := range d.Layers {
			fmt.Fprintln(w, "    "+layerLine(l))
			if l.Share != nil {
				fmt.Fprintln(w, "      "+shareLine(*l.Share))
			}
		}
	}
}

func ruleText(r *service.UsageRule) string {
	if r.Name == "" {
		return r.Path
	}
	return r.Path + " (" + r.Name + ")"
}

// layerLine describes one layer's bucket.
func layerLine(l service.UsageLayer) string {
	s := l.Layer + ": " + limitText(l.Limit)
	if l.Share != nil {
		s = l.Layer + ": Redis' part " + limitText(l.Limit)
	}
	switch {
	case l.Error != "":
		s += ", no answer: " + l.Error
	case l.NotEnforced != "":
		s += ", not enforced: " + l.NotEnforced
	default:
		s += fmt.Sprintf(", remaining %d (%s), full in %s", l.Remaining, inUse(l.Limit, l.Remaining), l.FullIn)
	}
	return s + " [" + l.Source + "]"
}

// shareLine describes this node's standing share of a global bucket.
func shareLine(sh service.UsageShare) string {
	s := fmt.Sprintf("share %g of the limit over the nodes: ", sh.Fraction)
	if sh.Nodes == 0 {
		return s + "this node holds none now (Redis' part decides)"
	}
	return s + fmt.Sprintf("this node's cell (1 of %d) %s, remaining %d (%s), full in %s [memory (this node)]",
		sh.Nodes, limitText(sh.Limit), sh.Remaining, inUse(sh.Limit, sh.Remaining), sh.FullIn)
}

// limitText writes a limit: "limit 10/minute, burst 10".
func limitText(l service.UsageLimit) string {
	unit := l.Unit
	switch {
	case unit == "":
		unit = l.Period
	case l.UnitMultiplier > 1:
		unit = fmt.Sprintf("%d %ss", l.UnitMultiplier, unit)
	}
	return fmt.Sprintf("limit %d/%s, burst %d", l.RequestsPerUnit, unit, l.Burst)
}

// inUse is a bucket's current utilisation: the share of its burst taken and
// not yet refilled, (burst - remaining) / burst. It is a reading of now,
// not of a period: the metrics of a rule with utilisation give the tokens
// taken over time.
func inUse(l service.UsageLimit, remaining uint64) string {
	if l.Burst == 0 {
		return "no burst"
	}
	used := l.Burst - min(remaining, l.Burst)
	return fmt.Sprintf("%.0f%% in use", 100*float64(used)/float64(l.Burst))
}

// printTop writes a TopRefusedAnswer, one block per rule.
func printTop(w io.Writer, a service.TopRefusedAnswer) {
	fmt.Fprintf(w, "refused most over the last %d minutes (%d counters per rule and minute)\n", a.Minutes, a.K)
	if a.Untracked > 0 {
		fmt.Fprintf(w, "  %d refusals of rules beyond the tracked ones (since start)\n", a.Untracked)
	}
	if len(a.Rules) == 0 {
		fmt.Fprintln(w, "  no refusals")
	}
	for _, r := range a.Rules {
		fmt.Fprintf(w, "  %s %s: %d refused, counts at most %d too high\n", r.Domain, r.Rule, r.Refusals, r.MaxError)
		for _, v := range r.Values {
			n := strconv.FormatUint(v.Count, 10)
			if v.AtLeast != v.Count {
				n = fmt.Sprintf("%d to %d", v.AtLeast, v.Count)
			}
			fmt.Fprintf(w, "    %s  %s\n", n, v.Value)
		}
	}
}
