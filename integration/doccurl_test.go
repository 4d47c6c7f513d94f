package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// This file carries no build tag, as doclinks_test.go.

// curlNoHost matches a curl command whose URL starts with ":port": curl
// 7.x refuses it (exit 3, "URL using bad/illegal format").
var curlNoHost = regexp.MustCompile(`\bcurl\b[^\x60\n|;&]*\s:[0-9]+`)

// TestDocCurlCommandsNameAHost: every curl command of README.md and docs/
// names the host of its URL, so that it runs as printed with every curl.
func TestDocCurlCommandsNameAHost(t *testing.T) {
	files := []string{"../README.md"}
	err := filepath.WalkDir("../docs", func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(b), "\n") {
			if m := curlNoHost.FindString(line); m != "" {
				t.Errorf("%s:%d: %q: name the host (127.0.0.1:PORT); curl 7.88 refuses a URL starting with ':'", file, n+1, m)
			}
		}
	}
}
