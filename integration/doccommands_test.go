//go:build integration

package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// docCommand is one shell command of a doc: a line (with its
// backslash-continued lines) of a sh or bash code block, a "$ " line of a
// console block, or a shell assignment in inline code of the prose. Or,
// with logged set and no text, a plain code block of the node's log lines.
type docCommand struct {
	file string
	line int    // 1-based, of the command's first line
	text string // as printed, continuation lines joined by "\\\n"
	// output is what a console block prints after the command; nil when
	// the doc shows none.
	output []string
	// logged are the lines the doc shows the node logging ("level=…"),
	// each up to a trailing " ...".
	logged []string
}

func (c docCommand) String() string { return fmt.Sprintf("%s:%d: %s", c.file, c.line, c.text) }

// fence opens or closes a fenced code block; the group is its info string.
var fence = regexp.MustCompile("^(\\s*)```\\s*(\\S*)")

// proseAssignment is inline code of the prose that assigns a shell
// variable the doc's later commands use (`A="--addr …"`).
var proseAssignment = regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*=\"[^\"`]*\")`")

// docCommands returns the commands of md, a Markdown file named file, in
// their order: those of ```sh, ```bash and ```console blocks and the
// variable assignments in the prose's inline code. It fails on a console
// block without a "$ " command, whose output would go unchecked.
func docCommands(file, md string) ([]docCommand, error) {
	var out []docCommand
	lines := strings.Split(md, "\n")
	for i := 0; i < len(lines); i++ {
		m := fence.FindStringSubmatch(lines[i])
		if m == nil {
			for _, a := range proseAssignment.FindAllStringSubmatch(lines[i], -1) {
				out = append(out, docCommand{file: file, line: i + 1, text: a[1]})
			}
			continue
		}
		indent, lang := m[1], m[2]
		start := i + 1
		end := start
		for end < len(lines) && !fence.MatchString(lines[end]) {
			end++
		}
		if end == len(lines) {
			return nil, fmt.Errorf("%s:%d: code block not closed", file, i+1)
		}
		body := lines[start:end]
		for j := range body {
			body[j] = strings.TrimPrefix(body[j], indent)
		}
		switch lang {
		case "sh", "bash":
			out = append(out, shellCommands(file, start, body)...)
		case "console":
			cmds := consoleCommands(file, start, body)
			if len(cmds) == 0 {
				return nil, fmt.Errorf("%s:%d: console block without a \"$ \" command: show the command its output comes from", file, i+1)
			}
			out = append(out, cmds...)
		case "":
			if len(body) > 0 && strings.HasPrefix(body[0], "level=") {
				out = append(out, docCommand{file: file, line: start + 1, logged: body})
			}
		}
		i = end
	}
	return out, nil
}

// shellCommands returns the commands of a sh block's lines, the first
// at 0-based line first: every line but blank lines and comments, with
// the lines a trailing backslash continues it onto.
func shellCommands(file string, first int, body []string) []docCommand {
	var out []docCommand
	for j := 0; j < len(body); j++ {
		l := strings.TrimSpace(body[j])
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		c := docCommand{file: file, line: first + j + 1, text: l}
		for strings.HasSuffix(c.text, "\\") && j+1 < len(body) {
			j++
			c.text += "\n" + body[j]
		}
		out = append(out, c)
	}
	return out
}

// consoleCommands returns the "$ " commands of a console block's lines,
// each with the lines up to the next command as its output (trailing blank
// lines dropped).
func consoleCommands(file string, first int, body []string) []docCommand {
	var out []docCommand
	for j := 0; j < len(body); j++ {
		text, ok := strings.CutPrefix(body[j], "$ ")
		if !ok {
			if len(out) > 0 {
				out[len(out)-1].output = append(out[len(out)-1].output, body[j])
			}
			continue
		}
		c := docCommand{file: file, line: first + j + 1, text: text, output: []string{}}
		for strings.HasSuffix(c.text, "\\") && j+1 < len(body) {
			j++
			c.text += "\n" + body[j]
		}
		out = append(out, c)
	}
	for i := range out {
		o := out[i].output
		for len(o) > 0 && strings.TrimSpace(o[len(o)-1]) == "" {
			o = o[:len(o)-1]
		}
		out[i].output = o
	}
	return out
}

func TestDocCommandsParse(t *testing.T) {
	t.Parallel()
	md := "Set `A=\"--addr x\"` first.\n" +
		"```sh\n# a comment\nrls serve   # trailing\n\ncurl a \\\n  -d b\n```\n" +
		"```yaml\nkey: v\n```\n" +
		"```\nlevel=INFO msg=x ...\n```\n" +
		"   ```console\n   $ rls check\n   OK\n     detail\n\n   $ rls version\n   ```\n"
	got, err := docCommands("f.md", md)
	if err != nil {
		t.Fatal(err)
	}
	want := []docCommand{
		{file: "f.md", line: 1, text: `A="--addr x"`},
		{file: "f.md", line: 4, text: "rls serve   # trailing"},
		{file: "f.md", line: 6, text: "curl a \\\n  -d b"},
		{file: "f.md", line: 13, logged: []string{"level=INFO msg=x ..."}},
		{file: "f.md", line: 16, text: "rls check", output: []string{"OK", "  detail"}},
		{file: "f.md", line: 20, text: "rls version", output: []string{}},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(docCommand{})); diff != "" {
		t.Errorf("docCommands (-want +got):\n%s", diff)
	}
	if _, err := docCommands("f.md", "```console\nOK\n```\n"); err == nil {
		t.Error("a console block without a command: no error")
	}
}

// docSkip is a command the test does not run: what it needs is missing
// here, or running it would touch what is not the test's.
type docSkip struct {
	match   string // a prefix of the command as the doc prints it
	why     string
	standIn string // run instead (rewritten as a doc command), if not ""
}

// docSkips are every command of the docs the test does not run.
var docSkips = []docSkip{
	{match: "make test", why: "runs every test, this one included"},
	{match: "git tag ", why: "would tag the repository the test runs in; `make build VERSION=…` does not need the tag"},
	{match: "docker build ", why: "no Docker engine here; envoy-examples/dockerfile_release_test.go checks the Dockerfile's version stamping"},
	{match: "kubectl -n sluice create secret generic sluice-emergency ", why: "no cluster here",
		standIn: "mkdir -p /etc/sluice/emergency && cp digests /etc/sluice/emergency/digests # where the Secret is mounted"},
	{match: `curl -H "x-sluice-emergency: $SECRET" https://api.example.com/`, why: "needs an Envoy in front of the node",
		standIn: `rls check --domain edge emergency="$SECRET" remote_address=50.0.0.5 # the descriptors Envoy sends for it`},
}

// docPrograms are the commands the test runs, by the prefix the doc
// prints them with: a command that starts with none and is not in
// docSkips fails the test, so a new doc command is run or named.
var docPrograms = []string{"rls ", "go run ./cmd/rls ", "bin/rls ", "make build ", "curl ", "head ", "grep ", "printf ", "openssl "}

// docRewrite adapts a doc command to the test's processes: from, a
// regular expression, is replaced by to, in which {rls}, {grpc}, {http},
// {admin}, {redis} and {tmp} name the built binary, the addresses of the
// node started last, the test's Redis and the test's directory.
type docRewrite struct {
	from *regexp.Regexp
	to   string
	why  string
}

// docRewrites apply in this order, each to the result of the ones before.
var docRewrites = []docRewrite{
	{from: regexp.MustCompile(`^go run \./cmd/rls `), to: "rls ", why: "the binary TestMain built"},
	{from: regexp.MustCompile(`^rls serve \.\.\. `), to: "rls serve ", why: `"..." stands for the flags shown before`},
	{from: regexp.MustCompile(`^rls serve\b`), to: "{rls} serve --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0", why: "free loopback ports, read from the node's log"},
	{from: regexp.MustCompile(`^rls check `), to: "{rls} check --addr {grpc} ", why: "the default --addr 127.0.0.1:8081 is the node's gRPC address"},
	{from: regexp.MustCompile(`^rls usage `), to: "{rls} usage --addr {admin} ", why: "the default --addr 127.0.0.1:8082 is the node's admin address"},
	{from: regexp.MustCompile(`^rls `), to: "{rls} ", why: "the binary TestMain built"},
	{from: regexp.MustCompile(`\b127\.0\.0\.1:8082\b`), to: "{admin}", why: "the node's admin address"},
	{from: regexp.MustCompile(`\b(localhost|127\.0\.0\.1):8080\b`), to: "{http}", why: "the node's HTTP address"},
	{from: regexp.MustCompile(`\bredis://redis:6379\b`), to: "redis://{redis}", why: "the test's redis-server"},
	{from: regexp.MustCompile(`/etc/sluice/`), to: "{tmp}/etc/sluice/", why: "the test's directory"},
	{from: regexp.MustCompile(`^make build `), to: "make build BIN={tmp}/bin/rls ", why: "builds into the test's directory, not the repository's bin/"},
	{from: regexp.MustCompile(`^bin/rls `), to: "{tmp}/bin/rls ", why: "what make build built"},
}

// docEnv is added to rlsEnv's environment for every doc command: the
// nodes' Redis calls get the time a busy test machine may take (the
// default, 10ms, is for a production Redis next to the node).
var docEnv = []string{"RLS_REDIS_TIMEOUT=2s"}

// docExit is a command the doc shows failing, with the exit status it
// documents.
type docExit struct {
	match string // a substring of the command as the doc prints it
	code  int
}

// docExits are the doc commands that exit otherwise than 0.
var docExits = []docExit{
	{match: "check --domain edge remote_address=50.0.0.5", code: 1}, // OVER_LIMIT
	{match: "check --domain edge api_key=AKIA-LEAKED", code: 1},     // OVER_LIMIT
	{match: "--rule edge.login --allow", code: 1},                   // refused: protected rule
}

// docMasks replace what differs from run to run in a command's output,
// in both the doc's and the command's, before they are compared.
var docMasks = []struct {
	re *regexp.Regexp
	to string
}{
	{regexp.MustCompile(`\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z\b`), "<time>"}, // an expiry, a log line's time
	{regexp.MustCompile(`commit [0-9a-f]+…?`), "commit <hash>"},                   // the repository's HEAD
	{regexp.MustCompile(`\bgo1\.\d+(\.\d+)?\b`), "go<version>"},                   // the toolchain that ran make build (envoy-examples/goversion_test.go pins the README's to go.mod's)
	{regexp.MustCompile(`\bnode=\S+`), "node=<node>"},                             // host name and PID
}

func maskOutput(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		for _, m := range docMasks {
			l = m.re.ReplaceAllString(l, m.to)
		}
		out[i] = strings.TrimRight(l, " ")
	}
	return out
}

// TestDocCommands runs every shell command of README.md and
// docs/operating-limits.md, adapted by docRewrites, against the built
// binary, a node it starts and a real redis-server, and fails when one
// exits otherwise than the doc says (0, or docExits), prints other than
// the doc's console output (after docMasks), or is neither run
// (docPrograms) nor skipped (docSkips).
func TestDocCommands(t *testing.T) {
	t.Parallel()
	used := &docUses{n: map[any]int{}}
	t.Run("files", func(t *testing.T) {
		for _, file := range []string{"README.md", "docs/operating-limits.md"} {
			t.Run(filepath.Base(file), func(t *testing.T) {
				t.Parallel()
				runDocCommands(t, file, used)
			})
		}
	})
	if t.Failed() {
		return
	}
	for i, s := range docSkips {
		if used.n[&docSkips[i]] == 0 {
			t.Errorf("docSkips: %q matches no doc command: remove it", s.match)
		}
	}
	for i, r := range docRewrites {
		if used.n[&docRewrites[i]] == 0 {
			t.Errorf("docRewrites: %s matches no doc command: remove it", r.from)
		}
	}
	for i, e := range docExits {
		if used.n[&docExits[i]] == 0 {
			t.Errorf("docExits: %q matches no doc command: remove it", e.match)
		}
	}
}

// docUses counts the uses of the entries of docSkips, docRewrites and
// docExits, by their address, so that an entry no doc command uses fails.
type docUses struct {
	mu sync.Mutex
	n  map[any]int
}

func (u *docUses) add(entry any) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.n[entry]++
}

// docRun is the state of one doc's commands: the node started last, the
// Redis, the variables assigned so far.
type docRun struct {
	t     *testing.T
	dir   string // commands' working directory
	tmp   string
	node  *rlsProcess // nil when none runs
	addrs string      // the addresses of the node started last, for table
	redis *redistest.Server
	env   []string // rlsEnv, then the variables assigned so far (NAME=value)
	used  *docUses
}

func runDocCommands(t *testing.T, file string, used *docUses) {
	b, err := os.ReadFile(filepath.Join("..", file))
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := docCommands(file, string(b))
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	r := &docRun{t: t, dir: root, tmp: t.TempDir(), env: rlsEnv(docEnv...), used: used}
	if file != "README.md" {
		// docs/operating-limits.md works in a directory of its own, its
		// HOME, on the rules its examples name (rules/), with /etc/sluice
		// made. README.md works in the repository as a developer does
		// (its go and make commands use the developer's caches).
		r.dir = r.tmp
		r.env = rlsEnv(append(docEnv, "HOME="+r.tmp)...)
		rules, err := os.ReadFile(filepath.Join(root, "ruleset/default-rules.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, "\n  # A protected rule.\n  - key: login\n    protected: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"...)
		if err := os.MkdirAll(filepath.Join(r.tmp, "rules"), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(r.tmp, "rules"), "edge.yaml", string(rules))
		if err := os.MkdirAll(filepath.Join(r.tmp, "etc/sluice"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if len(cmds) == 0 {
		t.Fatalf("%s: no commands found", file)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(r.table())
		}
	})
	for _, c := range cmds {
		r.run(c)
	}
	if r.node != nil {
		r.stopNode()
	}
}

// run runs c, or its stand-in when docSkips names it.
func (r *docRun) run(c docCommand) {
	t := r.t
	if c.logged != nil {
		r.checkLog(c)
		return
	}
	for i, s := range docSkips {
		if strings.HasPrefix(c.text, s.match) {
			r.used.add(&docSkips[i])
			t.Logf("%s:%d: skipped (%s): %s", c.file, c.line, s.why, c.text)
			if s.standIn != "" {
				r.exec(docCommand{file: c.file, line: c.line, text: s.standIn})
			}
			return
		}
	}
	_, known := assignedName(c.text)
	for _, p := range docPrograms {
		known = known || strings.HasPrefix(c.text, p)
	}
	if !known {
		t.Errorf("%s: neither run (docPrograms) nor skipped (docSkips): add it to one", c)
		return
	}
	r.exec(c)
}

// exec runs c, rewritten: a node started when it is an rls serve, a
// variable kept when it is an assignment.
func (r *docRun) exec(c docCommand) {
	t := r.t
	name, isAssignment := assignedName(c.text)
	text := r.rewrite(c)
	if strings.HasPrefix(text, rlsBinary+" serve ") {
		r.startNode(c, text)
		return
	}
	want := 0
	for i, e := range docExits {
		if strings.Contains(c.text, e.match) {
			r.used.add(&docExits[i])
			want = e.code
		}
	}
	script := text
	if isAssignment {
		script += fmt.Sprintf("\nprintf %%s \"$%s\"", name)
	}
	out, code := r.shell(script)
	if code != want {
		t.Errorf("%s\nran: %s\nexit status %d, want %d; output:\n%s", c, text, code, want, out)
		return
	}
	if isAssignment {
		r.env = append(r.env, name+"="+out)
		return
	}
	if c.output != nil {
		got := maskOutput(strings.Split(strings.TrimRight(out, "\n"), "\n"))
		if diff := cmp.Diff(maskOutput(c.output), got); diff != "" {
			t.Errorf("%s\nran: %s\noutput differs from the doc's (-doc +got):\n%s", c, text, diff)
		}
	}
}

// checkLog waits until the node started last has logged every line of c
// (after docMasks; a line ending in " ..." up to there).
func (r *docRun) checkLog(c docCommand) {
	if r.node == nil {
		r.t.Fatalf("%s:%d: log lines before a doc command started a node", c.file, c.line)
	}
	for _, want := range maskOutput(c.logged) {
		want = strings.TrimSuffix(want, " ...")
		pollUntil(r.t, fmt.Sprintf("%s:%d: the node's log line %q (after docMasks)", c.file, c.line, want), func() bool {
			return strings.Contains(maskOutput([]string{r.node.Log()})[0], want)
		})
	}
}

var assignment = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)=`)

// assignedName returns the variable a command assigns, if it is a shell
// assignment.
func assignedName(cmd string) (string, bool) {
	m := assignment.FindStringSubmatch(cmd)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// rewrite applies docRewrites to c, its comments dropped.
func (r *docRun) rewrite(c docCommand) string {
	text := dropComments(c.text)
	for i, rw := range docRewrites {
		if !rw.from.MatchString(text) {
			continue
		}
		r.used.add(&docRewrites[i])
		to := strings.NewReplacer("{rls}", rlsBinary, "{tmp}", r.tmp).Replace(rw.to)
		if strings.Contains(to, "{redis}") {
			if r.redis == nil {
				r.redis = redistest.Start(r.t)
			}
			to = strings.ReplaceAll(to, "{redis}", r.redis.Addr())
		}
		if strings.Contains(to, "{grpc}") || strings.Contains(to, "{http}") || strings.Contains(to, "{admin}") {
			if r.node == nil {
				r.t.Fatalf("%s: names a node's address (%s) before a doc command started a node", c, rw.to)
			}
			to = strings.NewReplacer("{grpc}", r.node.GRPCAddr, "{http}", r.node.HTTPAddr, "{admin}", r.node.AdminAddr).Replace(to)
		}
		text = rw.from.ReplaceAllLiteralString(text, to)
	}
	return text
}

// dropComments drops the comment that ends each line of cmd: from a "#"
// after a blank, outside quotes, to the line's end.
func dropComments(cmd string) string {
	lines := strings.Split(cmd, "\n")
	for i, l := range lines {
		lines[i] = dropComment(l)
	}
	return strings.Join(lines, "\n")
}

func dropComment(line string) string {
	var quote rune
	for j, c := range line {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#' && j > 0 && (line[j-1] == ' ' || line[j-1] == '\t'):
			return strings.TrimRight(line[:j], " \t")
		}
	}
	return line
}

// table prints docRewrites and docEnv as they applied last, for a
// failure's message.
func (r *docRun) table() string {
	var b strings.Builder
	b.WriteString("rewrites (docRewrites):\n")
	for _, rw := range docRewrites {
		fmt.Fprintf(&b, "  %-40s → %-50s (%s)\n", rw.from, rw.to, rw.why)
	}
	fmt.Fprintf(&b, "environment (docEnv): %s\nwhere {rls}=%s {tmp}=%s", strings.Join(docEnv, " "), rlsBinary, r.tmp)
	b.WriteString(r.addrs)
	if r.redis != nil {
		fmt.Fprintf(&b, " {redis}=%s", r.redis.Addr())
	}
	return b.String() + "\n"
}

// shell runs script with sh -c and returns its output (stdout and
// stderr as they interleave) and exit status.
func (r *docRun) shell(script string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", script)
	cmd.Dir, cmd.Env = r.dir, r.env
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), ee.ExitCode()
	} else if err != nil {
		r.t.Fatalf("sh -c %q: %v", script, err)
	}
	return out.String(), 0
}

// startNode stops the node started before, if any, and starts text, an
// rls serve, with sh -c: sh execs it, so the PID is the node's. It waits
// for its addresses in its log and for /healthcheck to answer 200.
func (r *docRun) startNode(c docCommand, text string) {
	if r.node != nil {
		r.stopNode()
	}
	cmd := exec.Command("sh", "-c", "exec "+text)
	cmd.Dir, cmd.Env = r.dir, r.env
	r.t.Logf("%s:%d: starting %s", c.file, c.line, text)
	r.node = startCmd(r.t, cmd)
	r.addrs = fmt.Sprintf(" {grpc}=%s {http}=%s {admin}=%s", r.node.GRPCAddr, r.node.HTTPAddr, r.node.AdminAddr)
	pollUntil(r.t, "the node's /healthcheck", func() bool {
		code, _ := r.node.HTTPGet(r.t, "/healthcheck")
		return code == 200
	})
}

// stopNode sends SIGTERM to the node by its PID and waits for it to exit.
func (r *docRun) stopNode() {
	r.node.Signal(r.t, syscall.SIGTERM)
	if err := r.node.Wait(r.t, 30*time.Second); err != nil {
		r.t.Errorf("node exited with %v after SIGTERM:\n%s", err, r.node.Log())
	}
	r.node = nil
}
