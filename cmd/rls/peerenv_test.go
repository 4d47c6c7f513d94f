package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestServePeerEnvAndEmbeddedRules runs rls serve configured only by
// envoyproxy/ratelimit's variables, without --config: it listens where
// HOST and PORT say, logs each mapping, warns that it serves the embedded
// example rules, and exports ratelimit_config_embedded 1.
func TestServePeerEnvAndEmbeddedRules(t *testing.T) {
	env := map[string]string{
		"HOST": "127.0.0.1", "PORT": "0", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0",
		"LOG_FORMAT": "json", "LOG_LEVEL": "info", "USE_STATSD": "false",
	}
	rls := serveInProcess(t, func(k string) string { return env[k] }, "--admin-addr", "")
	defer func() {
		if err := rls.Stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	start := rls.Serving()
	var lines []map[string]any
	for _, line := range strings.Split(rls.Log.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			lines = append(lines, m)
		}
	}
	find := func(level, msg, key, value string) bool {
		for _, m := range lines {
			if m["level"] == level && strings.Contains(m["msg"].(string), msg) && (key == "" || m[key] == value) {
				return true
			}
		}
		return false
	}
	for _, want := range []struct{ level, msg, key, value string }{
		{"INFO", "envoyproxy/ratelimit setting mapped", "vars", "HOST,PORT"},
		{"INFO", "envoyproxy/ratelimit setting mapped", "vars", "GRPC_HOST,GRPC_PORT"},
		{"INFO", "envoyproxy/ratelimit setting mapped", "flag", "--log-format"},
		{"INFO", "envoyproxy/ratelimit setting accepted", "var", "USE_STATSD"},
		{"WARN", "no --config: serving the embedded EXAMPLE rules", "", ""},
	} {
		if !find(want.level, want.msg, want.key, want.value) {
			t.Errorf("no %s line %q with %s=%s:\n%s", want.level, want.msg, want.key, want.value, rls.Log.String())
		}
	}
	addr, _ := start["http_addr"].(string)
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("http_addr %q: HOST and PORT not applied", addr)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), "\nratelimit_config_embedded 1\n") {
		t.Errorf("/metrics lacks ratelimit_config_embedded 1")
	}
}
