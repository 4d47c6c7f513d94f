// Command rls is sluice's rate-limit service for Envoy.
//
//	rls serve [flags]                 run the service (embedded example rules by default)
//	rls validate [flags] PATH...      check rule files or directories as one
//	                                  rule set, with serve's loading flags,
//	                                  and --adaptive-config's file
//	rls check --domain D k=v[,k=v]... ask a running server for a decision
//	                                  (exit 0 OK, 1 OVER_LIMIT, 2 error)
//	rls audit --redis URL             print the audit trail (reloads, overrides,
//	                                  adaptive triggers and restores)
//	rls usage --domain D k=v[,k=v]... read a server's buckets without spending
//	                                  (--top: the values refused most)
//	rls override set|list|rm          change runtime overrides (admin address)
//	rls version                       print the version, commit and Go version
//
// Run under the name ratelimit (the image's /bin/ratelimit, which Envoy
// Gateway's rate-limit Deployment runs, as envoyproxy/ratelimit's binary)
// with no command, it is rls serve.
//
// main only wires signals and exit codes; run holds the logic so that tests
// can call it in-process.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, commandArgs(os.Args), os.Stdout, os.Stderr, os.Getenv); err != nil {
		if !errors.Is(err, errUsage) && !errors.Is(err, errOverLimit) {
			fmt.Fprintln(os.Stderr, "rls:", err)
		}
		stop()
		os.Exit(exitCode(err))
	}
}

// commandArgs returns run's arguments for the command line argv: argv
// without the program name, and serve first when the program is named
// ratelimit and no command is given (nothing, or flags only).
func commandArgs(argv []string) []string {
	args := argv[1:]
	if filepath.Base(argv[0]) == "ratelimit" && (len(args) == 0 || strings.HasPrefix(args[0], "-")) {
		return append([]string{"serve"}, args...)
	}
	return args
}

// errUsage marks errors whose message the flag package already printed.
var errUsage = errors.New("usage")

// exitCode is 2 for usage errors, failed checks and failed audit reads, 1
// otherwise (among them rls check's OVER_LIMIT).
func exitCode(err error) int {
	if errors.Is(err, errUsage) || errors.As(err, new(checkError)) || errors.As(err, new(auditError)) {
		return 2
	}
	return 1
}

const usage = `usage:
  rls serve [flags]                    run the rate-limit service (rls serve -h lists flags)
  rls validate [flags] PATH...         check rule files or directories of *.yaml as the one
                                       rule set serve would load, and --adaptive-config FILE
                                       (rls validate -h lists flags)
  rls check [flags] KEY=VALUE[,KEY=VALUE]...
                                       ask a running server; one argument per descriptor;
                                       exit 0 OK, 1 OVER_LIMIT, 2 error (--tls-* for TLS)
  rls audit --redis URL [--count N] [--since 1h] [--kind reload|override.*|adaptive.*] [--json]
                                       print the audit trail newest first; exit 0, 2 on error
  rls usage [flags] --domain D KEY=VALUE[,KEY=VALUE]...
                                       read each descriptor's buckets on the admin address
                                       without spending a token; --top: the values refused
                                       most per rule; exit 0 answered, 2 error
  rls override set|list|rm [flags]     change a running fleet's runtime overrides through the
                                       admin address (rls override -h; docs/operating-limits.md)
  rls version [--json]                 print the version, commit and Go version

Flags may come before or after the arguments; after --, everything is an argument.
`

// run executes one rls command.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], stderr, getenv)
	case "validate":
		return validate(args[1:], stdout, stderr, getenv)
	case "check":
		return check(ctx, args[1:], stdout, stderr, getenv)
	case "audit":
		return auditCmd(ctx, args[1:], stdout, stderr, getenv)
	case "usage":
		return usageCmd(ctx, args[1:], stdout, stderr)
	case "override":
		return overrideCmd(ctx, args[1:], stdout, stderr)
	case "version":
		return versionCmd(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "rls: unknown command %q\n%s", args[0], usage)
	return errUsage
}
