package redis_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	type want struct {
		Addrs                              []string
		DB                                 int
		Username, Password                 string
		MasterName                         string
		SentinelUsername, SentinelPassword string
		Cluster, TLS                       bool
		PoolSize                           int
	}
	tests := []struct {
		in   string
		want want
	}{
		{"redis://127.0.0.1:6379/0", want{Addrs: []string{"127.0.0.1:6379"}}},
		{"redis://127.0.0.1:6379", want{Addrs: []string{"127.0.0.1:6379"}}},
		{"redis://localhost", want{Addrs: []string{"localhost:6379"}}},
		{"127.0.0.1:6380", want{Addrs: []string{"127.0.0.1:6380"}}},
		{"redis://u:p%40ss@h:1/3", want{Addrs: []string{"h:1"}, DB: 3, Username: "u", Password: "p@ss"}},
		{"redis://:secret@h:1", want{Addrs: []string{"h:1"}, Password: "secret"}},
		{"rediss://u:p@h:6380/1", want{Addrs: []string{"h:6380"}, DB: 1, Username: "u", Password: "p", TLS: true}},
		{"redis://h:1?pool_size=7", want{Addrs: []string{"h:1"}, PoolSize: 7}},
		{"redis://h:1?cluster=true", want{Addrs: []string{"h:1"}, Cluster: true}},
		{"redis://h1:1,redis://h2:2", want{Addrs: []string{"h1:1", "h2:2"}, Cluster: true}},
		{"h1:1,h2:2, h3:3", want{Addrs: []string{"h1:1", "h2:2", "h3:3"}, Cluster: true}},
		{"rediss://u:p@h1:1,h2:2", want{Addrs: []string{"h1:1", "h2:2"}, Username: "u", Password: "p", Cluster: true, TLS: true}},
		{"sentinel://mymaster@s1:26379,s2:26380", want{Addrs: []string{"s1:26379", "s2:26380"}, MasterName: "mymaster"}},
		{"sentinel://u:p@mymaster@s1:1/2", want{Addrs: []string{"s1:1"}, MasterName: "mymaster", Username: "u", Password: "p", DB: 2}},
		{"sentinel://:p%2Cw@m@s1", want{Addrs: []string{"s1:26379"}, MasterName: "m", Password: "p,w"}},
		{"sentinel://m@s1:1?sentinel_password=sp&sentinel_username=su",
			want{Addrs: []string{"s1:1"}, MasterName: "m", SentinelUsername: "su", SentinelPassword: "sp"}},
		{"sentinels://m@s1:1", want{Addrs: []string{"s1:1"}, MasterName: "m", TLS: true}},
		{"unix:///run/redis/redis.sock", want{Addrs: []string{"/run/redis/redis.sock"}}},
		{"unix://u:p@/run/redis.sock?db=2&pool_size=3", want{Addrs: []string{"/run/redis.sock"}, DB: 2, Username: "u", Password: "p", PoolSize: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			o, err := redisbackend.ParseURL(tt.in, 10*time.Millisecond)
			if err != nil {
				t.Fatalf("ParseURL(%q): %v", tt.in, err)
			}
			got := want{
				Addrs: o.Addrs, DB: o.DB, Username: o.Username, Password: o.Password,
				MasterName: o.MasterName, SentinelUsername: o.SentinelUsername,
				SentinelPassword: o.SentinelPassword, Cluster: o.IsClusterMode,
				TLS: o.TLSConfig != nil, PoolSize: o.PoolSize,
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseURL(%q) (-want +got):\n%s", tt.in, diff)
			}
			if !o.ContextTimeoutEnabled {
				t.Errorf("ParseURL(%q): ContextTimeoutEnabled false, want true", tt.in)
			}
			for name, d := range map[string]time.Duration{"ReadTimeout": o.ReadTimeout, "WriteTimeout": o.WriteTimeout, "PoolTimeout": o.PoolTimeout} {
				if d != 100*time.Millisecond {
					t.Errorf("ParseURL(%q): %s %v, want the 100ms backstop", tt.in, name, d)
				}
			}
			if o.MaxRetries != -1 || o.DialerRetries != 1 {
				t.Errorf("ParseURL(%q): MaxRetries %d DialerRetries %d, want -1 and 1", tt.in, o.MaxRetries, o.DialerRetries)
			}
		})
	}
}

func TestParseURLBackstop(t *testing.T) {
	t.Parallel()
	o, err := redisbackend.ParseURL("redis://h:1", 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if o.ReadTimeout != 500*time.Millisecond {
		t.Errorf("ReadTimeout for a 50ms timeout: %v, want 500ms", o.ReadTimeout)
	}
	o, err = redisbackend.ParseURL("redis://h:1?read_timeout=2s&max_retries=2", 0)
	if err != nil {
		t.Fatal(err)
	}
	if o.ReadTimeout != 2*time.Second || o.MaxRetries != 2 {
		t.Errorf("explicit read_timeout=2s max_retries=2: got %v, %d", o.ReadTimeout, o.MaxRetries)
	}
}

// TestParseURLErrorShortPassword: a password that is a common substring
// (here "e") is hidden by its place in the URL; the rest of the message is
// intact, so that it neither garbles the error nor shows where the
// password's letters are.
func TestParseURLErrorShortPassword(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"redis://user:e@h:1/x", "sentinel://user:e@m@s1:1/x"} {
		_, err := redisbackend.ParseURL(in, 0)
		if err == nil {
			t.Fatalf("ParseURL(%q) succeeded", in)
		}
		msg := err.Error()
		if !strings.Contains(msg, "user:xxxxx@") || !strings.Contains(msg, "parse redis address") || strings.Contains(msg, ":e@") {
			t.Errorf("ParseURL(%q) error %q; want the address with user:xxxxx@ and the message intact", in, msg)
		}
		if !strings.Contains(msg, "database") {
			t.Errorf("ParseURL(%q) error %q; want it to name the bad database", in, msg)
		}
	}
}

func TestParseURLErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, wantErr string }{
		{"", "empty address"},
		{"http://h:1", "unknown scheme"},
		{"redis://h:1/x", "invalid database"},
		{"redis://h:1?bogus=1", "bogus"},
		{"redis://h:1/2?cluster=true", "only database 0"},
		{"redis://h:1?cluster=maybe", "not a boolean"},
		{"h1:1,,h2:2", "empty element"},
		{"h1:1,h2", "not host:port"},
		{"h1:1,redis://h2:2/1", "only database 0"},
		{"h1:0,h2:2", "bad port"},
		{"justahost", "not host:port"},
		{"sentinel://s1:1", "missing master"},
		{"sentinel://@s1:1", "missing master"},
		{"sentinel://m@s1:1/x", "not a number"},
		{"sentinel://m@s1:1,", "empty element"},
		{"sentinel://m@s1:1?pool=1", "unknown sentinel parameter"},
		{"rediss://user:hunter2@h:1/x", "user:xxxxx@h:1"},
		{"sentinel://user:hunter2@m@s1:1/x", "user:xxxxx@m@s1:1"},
		{"sentinel://m@s1:1/x?sentinel_password=hunter2", "sentinel_password=xxxxx"},
		{"sentinel://m@s1:1?sentinel_password=hunter2&pool=1", "unknown sentinel parameter"},
		{"sentinel://m@s1:1?sentinel_password=hunter%32&pool=1", "sentinel_password=xxxxx"},
		{"sentinel://m@s1:1?sentinel_password=a&sentinel_password=hunter2&pool=1", "sentinel_password=xxxxx&sentinel_password=xxxxx&pool"},
		{"unix://run/redis.sock", "unix:///absolute/path"},
		{"unix://relative.sock", "unix:///absolute/path"},
		{"unix:///r.sock?cluster=true", "not a unix socket"},
		{"unix:///a.sock,unix:///b.sock", "not unix sockets"},
		{"unix://user:hunter2@/r.sock?db=x", "user:xxxxx@/r.sock"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			o, err := redisbackend.ParseURL(tt.in, 0)
			if err == nil {
				t.Fatalf("ParseURL(%q) = %+v, want an error containing %q", tt.in, o, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseURL(%q) error %q, want it to contain %q", tt.in, err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("ParseURL(%q) error %q repeats the password", tt.in, err)
			}
		})
	}
}
