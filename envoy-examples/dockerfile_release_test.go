package examples

import (
	"bufio"
	"regexp"
	"strings"
	"testing"
)

// dockerStage is the instructions of one FROM, with the FROM's arguments.
type dockerStage struct {
	from string
	body []instruction
}

// parseDockerfile splits a Dockerfile into the instructions before the
// first FROM (global ARGs) and its stages.
func parseDockerfile(t *testing.T, text string) (global []instruction, stages []dockerStage) {
	t.Helper()
	var cur string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur == "") {
			continue
		}
		if more, ok := strings.CutSuffix(line, `\`); ok {
			cur += more + " "
			continue
		}
		cur += line
		kw, args, _ := strings.Cut(cur, " ")
		in := instruction{strings.ToUpper(kw), strings.TrimSpace(args)}
		cur = ""
		switch {
		case in.keyword == "FROM":
			stages = append(stages, dockerStage{from: in.args})
		case len(stages) == 0:
			global = append(global, in)
		default:
			stages[len(stages)-1].body = append(stages[len(stages)-1].body, in)
		}
	}
	if len(stages) == 0 {
		t.Fatal("Dockerfile has no FROM")
	}
	return global, stages
}

// args returns the names of the ARGs declared in ins.
func args(ins []instruction) map[string]bool {
	names := map[string]bool{}
	for _, in := range ins {
		if in.keyword == "ARG" {
			name, _, _ := strings.Cut(in.args, "=")
			names[name] = true
		}
	}
	return names
}

var (
	// pinnedImage is a FROM image with both tag and digest: the tag for
	// readers and update bots, the digest for what is pulled.
	pinnedImage = regexp.MustCompile(`^[a-z0-9.\-/]+:[\w.\-]+@sha256:[0-9a-f]{64}$`)
	labelPair   = regexp.MustCompile(`([\w.\-]+)=("(?:[^"\\]|\\.)*"|\S+)`)
)

func TestDockerfileRelease(t *testing.T) {
	global, stages := parseDockerfile(t, repoFile(t, "Dockerfile"))
	if g := args(global); !g["VERSION"] || !g["COMMIT"] {
		t.Errorf("no global ARG VERSION and COMMIT before the first FROM (declared: %v)", g)
	}

	for _, st := range stages {
		image := strings.Fields(st.from)
		if len(image) > 0 && strings.HasPrefix(image[0], "--platform=") {
			image = image[1:]
		}
		if len(image) == 0 || !pinnedImage.MatchString(image[0]) {
			t.Errorf("FROM %s: want IMAGE:TAG@sha256:<64 hex digits>", st.from)
		}
	}

	// The build stage stamps the binary like `make build` does.
	build := stages[0]
	if a := args(build.body); !a["VERSION"] || !a["COMMIT"] {
		t.Errorf("build stage lacks ARG VERSION and ARG COMMIT (an ARG before FROM is not visible in a stage without them)")
	}
	makefile := []byte(repoFile(t, "Makefile"))
	m := regexp.MustCompile(`(?m)^LDFLAGS\s*:?=\s*(.*)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("Makefile defines no LDFLAGS")
	}
	ldflags := strings.NewReplacer("$(VERSION)", "${VERSION}", "$(COMMIT)", "${COMMIT}").Replace(strings.TrimSpace(string(m[1])))
	if !strings.Contains(ldflags, "-X main.buildCommit=${COMMIT}") || !strings.Contains(ldflags, "-X main.buildVersion=${VERSION}") {
		t.Errorf("Makefile LDFLAGS %q does not stamp VERSION and COMMIT", ldflags)
	}
	stamped := false
	for _, in := range build.body {
		if in.keyword == "RUN" && strings.Contains(in.args, "go build") && strings.Contains(in.args, `-ldflags "`+ldflags+`"`) {
			stamped = true
		}
	}
	if !stamped {
		t.Errorf("no RUN go build in the build stage with the Makefile's -ldflags %q", ldflags)
	}

	// The image: numeric user, OCI labels from the build args.
	final := stages[len(stages)-1]
	a := args(final.body)
	labels := map[string]string{}
	var user string
	for _, in := range final.body {
		switch in.keyword {
		case "USER":
			user = in.args
		case "LABEL":
			if !a["VERSION"] || !a["COMMIT"] {
				t.Errorf("LABEL before ARG VERSION and ARG COMMIT in the final stage: the labels would be empty")
			}
			for _, kv := range labelPair.FindAllStringSubmatch(in.args, -1) {
				labels[kv[1]] = strings.Trim(kv[2], `"`)
			}
		}
	}
	if user != "65532:65532" {
		t.Errorf("USER %q, want 65532:65532 (numeric: runAsNonRoot without runAsUser refuses a named user)", user)
	}
	want := map[string]string{
		"org.opencontainers.image.source":   "https://github.com/sluice-rls/sluice",
		"org.opencontainers.image.version":  "${VERSION}",
		"org.opencontainers.image.revision": "${COMMIT}",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.title":    "sluice",
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("LABEL %s=%q, want %q", k, labels[k], v)
		}
	}
	if labels["org.opencontainers.image.description"] == "" {
		t.Error("no LABEL org.opencontainers.image.description")
	}
	license := repoFile(t, "LICENSE")
	if !strings.Contains(license, "Apache License\n                           Version 2.0, January 2004") ||
		!strings.Contains(license, "Copyright 2026 The sluice authors") {
		t.Error("LICENSE is not the Apache License 2.0 with the sluice authors' copyright, as the licenses label says")
	}
}
