package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/node"
	"github.com/sluice-rls/sluice/override"
)

const overrideUsage = `usage:
  rls override set [flags] (--scale F | --limit N/unit | --block | --allow | --shadow) --reason "..." [--expires 2h]
  rls override list [flags]
  rls override rm [flags] [--reason "..."] ID

Changes the runtime overrides of a running server through its admin address
(/overrides): every node sharing its Redis applies them within a second.
Scope: --domain D, --rule PATH (as /rlconfig names it), --value key=value;
none: everything (scale only). An override that loosens the limits (--allow,
--shadow, --scale above 1, a higher --limit) needs --expires, at most the
server's --override-max-expiry (24h by default) ahead; protected rules refuse it. Authenticate with --token-file (a
file holding the bearer token, or name:token) or a client certificate
(--tls-cert, --tls-key). Exit status: 0 done, 1 refused, 2 usage,
connection or authentication error.

`

// overrideCLI are the flags every rls override subcommand shares.
type overrideCLI struct {
	addr, tokenFile string
	timeout         time.Duration
	tls             checkTLSFlags
}

func (c *overrideCLI) register(fs *flag.FlagSet) {
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8082", "admin address of the server (--admin-addr)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the bearer token (a line of the server's --admin-token-file: name:token, or the token alone)")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "deadline of the call")
	c.tls.register(fs)
}

// overrideRefused is an answer the server gave but refused (exit 1).
type overrideRefused struct{ msg string }

func (e overrideRefused) Error() string { return e.msg }

// overrideCmd runs rls override.
func overrideCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, overrideUsage)
		return errUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, overrideUsage)
		return nil
	case "set", "list", "rm":
	default:
		fmt.Fprintf(stderr, "rls override: unknown subcommand %q\n%s", args[0], overrideUsage)
		return errUsage
	}
	fs := flag.NewFlagSet("override "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, overrideUsage)
		fs.PrintDefaults()
	}
	var c overrideCLI
	c.register(fs)
	var req node.OverrideRequest
	var block, allow, shadow bool
	var scale float64
	var expires time.Duration
	if args[0] == "rm" {
		fs.StringVar(&req.Reason, "reason", "", "why (recorded in the audit log)")
	}
	if args[0] == "set" {
		fs.StringVar(&req.Domain, "domain", "", "domain the override applies to (empty: every domain)")
		fs.StringVar(&req.Rule, "rule", "", "rule the override applies to, by its /rlconfig path (e.g. edge.user_id)")
		fs.StringVar(&req.Value, "value", "", "key=value: only request descriptors carrying this entry")
		fs.Float64Var(&scale, "scale", 0, "multiply requests and burst by this factor (e.g. 1.5, 0.6)")
		fs.StringVar(&req.Limit, "limit", "", "set the rule's limit, N/unit (e.g. 10/second, 100/5 minutes)")
		fs.Func("burst", "bucket capacity with --limit (default: N)", func(v string) error {
			n, err := strconv.ParseUint(v, 10, 32)
			req.Burst = uint32(n)
			return err
		})
		fs.BoolVar(&block, "block", false, "refuse every descriptor carrying --value (limit 0)")
		fs.BoolVar(&allow, "allow", false, "bypass the rule or domain (needs --expires, at most the server's --override-max-expiry)")
		fs.BoolVar(&shadow, "shadow", false, "shadow the rule or domain: decide and count, answer OK (needs --domain and --expires, as --allow)")
		fs.StringVar(&req.Reason, "reason", "", "why (required; recorded in the audit log)")
		fs.StringVar(&req.Note, "note", "", "free text stored with the override")
		flags.DurationVar(fs, &expires, "expires", 0, "stop applying after this `duration` (e.g. 2h or 1d; required with --allow, --shadow, a --scale above 1 or a higher --limit, at most the server's --override-max-expiry, default 24h)")
	}
	if err := flags.ParseInterspersed(fs, args[1:]); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return errUsage
	}
	if err := c.tls.validate(); err != nil {
		fmt.Fprintln(stderr, "rls override:", err)
		return errUsage
	}
	switch args[0] {
	case "list":
		if fs.NArg() != 0 {
			fs.Usage()
			return errUsage
		}
		var out node.OverrideList
		if err := c.call(ctx, http.MethodGet, "/overrides", nil, &out); err != nil {
			return err
		}
		printOverrides(stdout, out)
		return nil
	case "rm":
		if fs.NArg() != 1 {
			fs.Usage()
			return errUsage
		}
		var out override.Override
		path := "/overrides/" + url.PathEscape(fs.Arg(0))
		if req.Reason != "" {
			path += "?reason=" + url.QueryEscape(req.Reason)
		}
		if err := c.call(ctx, http.MethodDelete, path, nil, &out); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "removed %s\n", out.String())
		return nil
	case "set":
		kinds := 0
		for _, k := range []struct {
			on   bool
			kind override.Kind
		}{{scale != 0, override.KindScale}, {req.Limit != "", override.KindLimit}, {block, override.KindBlock}, {allow, override.KindAllow}, {shadow, override.KindShadow}} {
			if k.on {
				kinds++
				req.Kind = string(k.kind)
			}
		}
		if kinds != 1 || fs.NArg() != 0 {
			fmt.Fprintln(stderr, "rls override set: give exactly one of --scale, --limit, --block, --allow, --shadow")
			return errUsage
		}
		req.Factor = scale
		if expires > 0 {
			req.ExpiresIn = expires.String()
		}
		var out override.Override
		if err := c.call(ctx, http.MethodPost, "/overrides", req, &out); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "set %s\n", out.String())
		return nil
	}
	return errUsage // not reached: the subcommand was checked above
}

// call sends one request to /overrides and decodes the answer into out.
func (c overrideCLI) call(ctx context.Context, method, path string, body, out any) error {
	client, base, err := c.tls.httpClient(c.addr)
	if err != nil {
		return checkError{err}
	}
	client.Timeout = c.timeout
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return checkError{err}
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return checkError{err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.tokenFile != "" {
		tok, err := readClientToken(c.tokenFile)
		if err != nil {
			return checkError{err}
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := client.Do(req)
	if err != nil {
		return checkError{fmt.Errorf("%s %s: %w", method, path, err)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return checkError{fmt.Errorf("%s %s: %w", method, path, err)}
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		if err := json.Unmarshal(data, out); err != nil {
			return checkError{fmt.Errorf("%s %s: answer: %w", method, path, err)}
		}
		return nil
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode >= 500 || resp.StatusCode == http.StatusNotFound && method != http.MethodDelete:
		return checkError{fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(data)))}
	}
	return overrideRefused{fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(data)))}
}

// readClientToken reads the first token line of path: "name:token" or the
// token alone.
func readClientToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if _, tok, ok := strings.Cut(line, ":"); ok {
			return strings.TrimSpace(tok), nil
		}
		return line, nil
	}
	return "", fmt.Errorf("--token-file %s: no token", path)
}

// printOverrides prints rls override list's table.
func printOverrides(w io.Writer, l node.OverrideList) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tEFFECT\tSCOPE\tAUTHOR\tEXPIRES\tREASON")
	for _, o := range l.Overrides {
		exp := "never"
		if !o.Expires.IsZero() {
			exp = o.Expires.UTC().Format(time.RFC3339)
		}
		// Reasons, authors and values are anybody's text: escaped, so that
		// no newline or escape sequence reaches the terminal raw.
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", override.Quote(o.ID), o.Effect(), override.Quote(o.Scope()), override.Quote(o.Author), exp, strconv.Quote(o.Reason))
	}
	_ = tw.Flush()
	for _, s := range l.NotApplied {
		fmt.Fprintln(w, "not applied:", override.Quote(s))
	}
	for _, b := range l.Malformed {
		fmt.Fprintf(w, "malformed, skipped (remove with rls override rm %s): %s\n", override.Quote(b.ID), override.Quote(b.Err))
	}
	if !l.StoreHealthy {
		fmt.Fprintf(w, "store %s unreachable (%s): the node applies the overrides it last read\n", l.Store, override.Quote(l.StoreError))
	}
}
