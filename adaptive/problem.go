package adaptive

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Problem is one problem of an adaptive-limits file.
type Problem struct {
	// Line is the 1-based line of the value at fault (or of the policy
	// or signal lacking it); 0: the file as a whole.
	Line int
	Msg  string
}

// Problems is every problem Parse or Load found in an adaptive-limits
// file, in the order found. Its message has one line per problem,
// "PATH:LINE: reason" (the path "adaptive config" when Parse was given
// bytes, the line left out when it is 0).
type Problems struct {
	Path string
	List []Problem
}

func (e *Problems) Error() string {
	path := e.Path
	if path == "" {
		path = "adaptive config"
	}
	lines := make([]string, len(e.List))
	for i, p := range e.List {
		if p.Line > 0 {
			lines[i] = fmt.Sprintf("%s:%d: %s", path, p.Line, p.Msg)
		} else {
			lines[i] = path + ": " + p.Msg
		}
	}
	return strings.Join(lines, "\n")
}

// yamlLine is the line yaml.v3 puts in its messages: "line N: reason",
// after "yaml: " in a syntax error's.
var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// decodeProblems turns a yaml.v3 error into Problems, one per message
// of a *yaml.TypeError, with the line yaml.v3 names.
func decodeProblems(err error) []Problem {
	msgs := []string{err.Error()}
	if te := new(yaml.TypeError); errors.As(err, &te) {
		msgs = te.Errors
	}
	out := make([]Problem, 0, len(msgs))
	for _, m := range msgs {
		p := Problem{Msg: m}
		if s := yamlLine.FindStringSubmatch(m); s != nil {
			p.Line, _ = strconv.Atoi(s[1])
			p.Msg = s[2]
		}
		out = append(out, p)
	}
	return out
}

// at is a value of the file as parsed, to find the lines of its fields;
// its zero value (a Config built in code, or a field the file leaves out)
// is at line 0.
type at struct{ n *yaml.Node }

// key returns the value of key k when a is a mapping.
func (a at) key(k string) at {
	if a.n == nil || a.n.Kind != yaml.MappingNode {
		return at{}
	}
	for i := 0; i+1 < len(a.n.Content); i += 2 {
		if a.n.Content[i].Value == k {
			return at{a.n.Content[i+1]}
		}
	}
	return at{}
}

// index returns element i when a is a sequence.
func (a at) index(i int) at {
	if a.n == nil || a.n.Kind != yaml.SequenceNode || i >= len(a.n.Content) {
		return at{}
	}
	return at{a.n.Content[i]}
}

// line is the line of field k of a, or of a itself when the file leaves
// k out (a default at fault, or a field missing).
func (a at) line(k string) int {
	if v := a.key(k); v.n != nil {
		return v.n.Line
	}
	if a.n == nil {
		return 0
	}
	return a.n.Line
}
