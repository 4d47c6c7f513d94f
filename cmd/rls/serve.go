package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/node"
)

// serve runs `rls serve`: a node from the flags, until ctx is done, then
// drains and returns nil.
func serve(ctx context.Context, args []string, stderr io.Writer, getenv func(string) string) error {
	n, err := newNode(ctx, args, stderr, getenv)
	if n == nil || err != nil {
		return err
	}
	return n.Run(ctx)
}

// newNode parses `rls serve`'s flags and returns the node they describe,
// logging to stderr; nil and no error for -h.
func newNode(ctx context.Context, args []string, stderr io.Writer, getenv func(string) string) (*node.Node, error) {
	st, err := flags.ParseServe(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	log := newLogger(st.LogLevel, st.LogFormat, stderr)
	for _, n := range st.PeerNotes {
		log.Log(ctx, n.Level, n.Msg, n.Args...)
	}
	for _, w := range flags.UnknownEnv(os.Environ()) {
		log.Warn(w)
	}
	opts := st.Options
	opts.Logger = log
	opts.Build = currentBuild()
	return node.New(opts)
}
