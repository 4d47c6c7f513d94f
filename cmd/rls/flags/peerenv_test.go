package flags_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/internal/egtest"
	"github.com/sluice-rls/sluice/tracing"
)

// TestPeerEnvMaps: each envoyproxy/ratelimit variable that means the same
// as a sluice flag sets that flag, its value converted.
func TestPeerEnvMaps(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		args  []string
		check func(flags.Serve) error
	}{
		{"HOST and PORT", map[string]string{"HOST": "10.0.0.1", "PORT": "9000"}, nil, func(s flags.Serve) error {
			return want("--http-addr", s.HTTPAddr, "10.0.0.1:9000")
		}},
		{"PORT alone", map[string]string{"PORT": "9000"}, nil, func(s flags.Serve) error {
			return want("--http-addr", s.HTTPAddr, "0.0.0.0:9000")
		}},
		{"GRPC_HOST and GRPC_PORT", map[string]string{"GRPC_HOST": "::1", "GRPC_PORT": "9001"}, nil, func(s flags.Serve) error {
			return want("--grpc-addr", s.GRPCAddr, "[::1]:9001")
		}},
		// GRPC_HOST and GRPC_PORT are unused while GRPC_UDS is set.
		{"GRPC_UDS", map[string]string{"GRPC_UDS": "/run/rl.sock", "GRPC_HOST": "10.0.0.1", "GRPC_PORT": "9001"}, nil, func(s flags.Serve) error {
			return want("--grpc-addr", s.GRPCAddr, "unix:/run/rl.sock")
		}},
		{"connection age", map[string]string{"GRPC_MAX_CONNECTION_AGE": "30m", "GRPC_MAX_CONNECTION_AGE_GRACE": "1m"}, nil, func(s flags.Serve) error {
			return errors.Join(want("--grpc-max-conn-age", s.GRPCMaxConnAge, 30*time.Minute), want("--grpc-max-conn-age-grace", s.GRPCMaxConnAgeGrace, time.Minute))
		}},
		{"gRPC mTLS", map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c.pem", "GRPC_SERVER_TLS_KEY": "k.pem", "GRPC_CLIENT_TLS_CACERT": "ca.pem"}, nil, func(s flags.Serve) error {
			return errors.Join(want("--tls-cert", s.TLSCert, "c.pem"), want("--tls-key", s.TLSKey, "k.pem"), want("--tls-client-ca", s.TLSClientCA, "ca.pem"))
		}},
		{"client SAN", map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c.pem", "GRPC_SERVER_TLS_KEY": "k.pem", "GRPC_CLIENT_TLS_CACERT": "ca.pem", "GRPC_CLIENT_TLS_SAN": "envoy.edge.svc"}, nil, func(s flags.Serve) error {
			return errors.Join(want("--tls-client-ca", s.TLSClientCA, "ca.pem"), want("--tls-client-san", s.TLSClientSAN, "envoy.edge.svc"))
		}},
		// Without a client CA the peer asks for no client certificate, so
		// checks no SAN: neither does sluice.
		{"client SAN without a client CA", map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c.pem", "GRPC_SERVER_TLS_KEY": "k.pem", "GRPC_CLIENT_TLS_SAN": "envoy.edge.svc"}, nil, func(s flags.Serve) error {
			return errors.Join(want("--tls-client-ca", s.TLSClientCA, ""), want("--tls-client-san", s.TLSClientSAN, ""), want("--tls-cert", s.TLSCert, "c.pem"))
		}},
		{"gRPC TLS files without GRPC_SERVER_USE_TLS", map[string]string{"GRPC_SERVER_TLS_CERT": "c.pem", "GRPC_SERVER_TLS_KEY": "k.pem"}, nil, func(s flags.Serve) error {
			return errors.Join(want("--tls-cert", s.TLSCert, ""), want("--tls-key", s.TLSKey, ""))
		}},
		{"LOG_LEVEL warning", map[string]string{"LOG_LEVEL": "warning", "LOG_FORMAT": "JSON"}, nil, func(s flags.Serve) error {
			return errors.Join(want("--log-level", s.LogLevel, slog.LevelWarn), want("--log-format", s.LogFormat, flags.LogJSON))
		}},
		{"LOG_LEVEL trace", map[string]string{"LOG_LEVEL": "trace"}, nil, func(s flags.Serve) error {
			return want("--log-level", s.LogLevel, slog.LevelDebug)
		}},
		{"RUNTIME_*", map[string]string{"RUNTIME_ROOT": "/srv/runtime_data/current", "RUNTIME_SUBDIRECTORY": "ratelimit"}, nil, func(s flags.Serve) error {
			return want("--config", s.Config, "/srv/runtime_data/current/ratelimit/config")
		}},
		{"RUNTIME_APPDIRECTORY", map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_APPDIRECTORY": "rules"}, nil, func(s flags.Serve) error {
			return want("--config", s.Config, "/data/rules")
		}},
		{"booleans", map[string]string{"MERGE_DOMAIN_CONFIG": "true", "SHADOW_MODE": "1", "LIMIT_RESPONSE_HEADERS_ENABLED": "TRUE"}, nil, func(s flags.Serve) error {
			return errors.Join(want("--merge-domains", s.MergeDomains, true), want("--shadow", s.Shadow, true), want("--ratelimit-headers", s.RateLimitHeaders, true))
		}},
		{"QUOTA_MODE", map[string]string{"QUOTA_MODE": "true"}, nil, func(s flags.Serve) error {
			return want("--quota-mode", s.QuotaMode, true)
		}},
		{"REDIS_STARTUP_* with any value", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_STARTUP_INITIAL_INTERVAL": "5s", "REDIS_STARTUP_MAX_INTERVAL": "1m", "REDIS_STARTUP_MAX_ELAPSED_TIME": "10m"}, nil, func(s flags.Serve) error {
			return want("--redis", s.Redis, "redis://r:6379")
		}},
		{"Redis CA", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "REDIS_TLS": "true", "REDIS_TLS_CACERT": "/ca.pem"}, nil, func(s flags.Serve) error {
			return errors.Join(want("--redis", s.Redis, "rediss://redis:6379"), want("--redis-ca", s.RedisCA, "/ca.pem"))
		}},
		{"Redis client certificate", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_TLS": "true", "REDIS_TLS_CLIENT_CERT": "/tls/c.pem", "REDIS_TLS_CLIENT_KEY": "/tls/k.pem"}, nil, func(s flags.Serve) error {
			return errors.Join(want("--redis", s.Redis, "rediss://r:6379"), want("--redis-tls-cert", s.RedisTLSCert, "/tls/c.pem"), want("--redis-tls-key", s.RedisTLSKey, "/tls/k.pem"))
		}},
		{"Redis client certificate without REDIS_TLS", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_TLS_CLIENT_CERT": "/tls/c.pem", "REDIS_TLS_CLIENT_KEY": "/tls/k.pem"}, nil, func(s flags.Serve) error {
			return errors.Join(want("--redis", s.Redis, "redis://r:6379"), want("--redis-tls-cert", s.RedisTLSCert, ""), want("--redis-tls-key", s.RedisTLSKey, ""))
		}},
		{"response metadata", map[string]string{"RESPONSE_DYNAMIC_METADATA": "true"}, nil, func(s flags.Serve) error {
			return want("--response-metadata", s.ResponseMetadata, true)
		}},
		{"header names", map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_LIMIT_HEADER": "X-RateLimit-Limit", "LIMIT_REMAINING_HEADER": "X-RateLimit-Remaining", "LIMIT_RESET_HEADER": "RateLimit-Reset"}, nil, func(s flags.Serve) error {
			return errors.Join(want("--ratelimit-header-limit", s.HeaderLimit, "X-RateLimit-Limit"), want("--ratelimit-header-remaining", s.HeaderRemaining, "X-RateLimit-Remaining"),
				want("--ratelimit-header-reset", s.HeaderReset, "RateLimit-Reset"), want("--ratelimit-headers", s.RateLimitHeaders, true))
		}},
		{"xDS", map[string]string{
			"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "eg:18001", "CONFIG_GRPC_XDS_NODE_ID": "rl",
			"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "ca.pem", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "c.pem",
			"CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "k.pem", "CONFIG_GRPC_XDS_SERVER_TLS_SAN": "eg.local", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "2s",
			"XDS_CLIENT_BACKOFF_MAX_INTERVAL": "1m", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "RUNTIME_ROOT": "/unused",
			"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "8388608",
		}, nil, func(s flags.Serve) error {
			return errors.Join(want("--xds-server", s.XDS.Server, "eg:18001"), want("--xds-node-id", s.XDS.NodeID, "rl"),
				want("--xds-tls-ca", s.XDS.TLSCA, "ca.pem"), want("--xds-tls-cert", s.XDS.TLSCert, "c.pem"), want("--xds-tls-key", s.XDS.TLSKey, "k.pem"),
				want("--xds-tls-server-name", s.XDS.TLSServerName, "eg.local"), want("--xds-backoff-min", s.XDS.BackoffMin, 2*time.Second),
				want("--xds-backoff-max", s.XDS.BackoffMax, time.Minute), want("--config", s.Config, ""), want("--max-rule-bytes", s.MaxRuleBytes, int64(8388608)),
				want("--xds-ready-before-rules", s.XDS.ReadyBeforeRules, true))
		}},
		// The peer's health check waits for rules only with
		// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED; without
		// FORCE_START_WITHOUT_INITIAL_CONFIG it serves nothing before them.
		{"xDS: healthy with rules loaded", map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true"}, nil, func(s flags.Serve) error {
			return want("--xds-ready-before-rules", s.XDS.ReadyBeforeRules, false)
		}},
		{"xDS: no force start", map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "FORCE_START_WITHOUT_INITIAL_CONFIG": "false"}, nil, func(s flags.Serve) error {
			return want("--xds-ready-before-rules", s.XDS.ReadyBeforeRules, false)
		}},
		{"statsd", map[string]string{"USE_STATSD": "true", "STATSD_HOST": "statsd", "STATSD_PORT": "9125", "STATS_FLUSH_INTERVAL": "5s"}, nil, func(s flags.Serve) error {
			return errors.Join(want("--statsd-addr", s.Statsd.Addr, "statsd:9125"), want("--statsd-interval", s.Statsd.Interval, 5*time.Second))
		}},
		// USE_STATSD is true by default.
		{"statsd by default", map[string]string{"STATSD_PORT": "9125"}, nil, func(s flags.Serve) error {
			return want("--statsd-addr", s.Statsd.Addr, "localhost:9125")
		}},
		{"statsd disabled", map[string]string{"USE_STATSD": "true", "DISABLE_STATS": "true"}, nil, func(s flags.Serve) error {
			return want("--statsd-addr", s.Statsd.Addr, "")
		}},
		// But only when one of its variables is set: the peer's implicit
		// localhost:8125 is not assumed.
		{"no statsd variable", map[string]string{"STATS_FLUSH_INTERVAL": "5s"}, nil, func(s flags.Serve) error {
			return want("--statsd-addr", s.Statsd.Addr, "")
		}},
		// Envoy Gateway's default: the peer's Prometheus endpoint, served
		// on its address and path, with a warning about the mapper: the
		// names there are sluice's.
		{"Prometheus", map[string]string{"USE_STATSD": "false", "USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001", "PROMETHEUS_PATH": "/stats", "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml"}, nil, func(s flags.Serve) error {
			var errs []error
			if !notedAt(s.PeerNotes, "PROMETHEUS_MAPPER_YAML", slog.LevelWarn) {
				errs = append(errs, fmt.Errorf("no warning about PROMETHEUS_MAPPER_YAML: %+v", s.PeerNotes))
			}
			return errors.Join(append(errs, want("--metrics-addr", s.MetricsAddr, ":19001"), want("--metrics-path", s.MetricsPath, "/stats"), want("--statsd-addr", s.Statsd.Addr, ""))...)
		}},
		{"Prometheus at the peer's default address", map[string]string{"USE_PROMETHEUS": "true"}, nil, func(s flags.Serve) error {
			return errors.Join(want("--metrics-addr", s.MetricsAddr, ":9090"), want("--metrics-path", s.MetricsPath, "/metrics"))
		}},
		{"Prometheus off", map[string]string{"USE_PROMETHEUS": "false", "PROMETHEUS_ADDR": ":19001"}, nil, func(s flags.Serve) error {
			return want("--metrics-addr", s.MetricsAddr, "")
		}},
		{"xDS at the peer's default address", map[string]string{"CONFIG_TYPE": "grpc_xds_sotw"}, nil, func(s flags.Serve) error {
			return want("--xds-server", s.XDS.Server, "localhost:18000")
		}},
		{"tracing sample rate", map[string]string{"TRACING_ENABLED": "true", "TRACING_SAMPLING_RATE": "0.25", "TRACING_EXPORTER_PROTOCOL": "grpc"}, []string{"--tracing-endpoint", "otel:4317"}, func(s flags.Serve) error {
			return want("--tracing-sample-ratio", s.TracingSampleRatio, 0.25)
		}},
		// Explicit sluice settings win, on the command line or as RLS_<FLAG>.
		{"flag wins", map[string]string{"GRPC_PORT": "9001"}, []string{"--grpc-addr", ":7000"}, func(s flags.Serve) error {
			return want("--grpc-addr", s.GRPCAddr, ":7000")
		}},
		{"RLS_ variable wins", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "old:6379", "RLS_REDIS": "redis://new:6379"}, nil, func(s flags.Serve) error {
			return want("--redis", s.Redis, "redis://new:6379")
		}},
		{"RLS_ variable wins over LOG_LEVEL", map[string]string{"LOG_LEVEL": "debug", "RLS_LOG_LEVEL": "error"}, nil, func(s flags.Serve) error {
			return want("--log-level", s.LogLevel, slog.LevelError)
		}},
		// A refusal naming a flag is lifted by that flag.
		{"--redis-timeout lifts REDIS_TIMEOUT", map[string]string{"REDIS_TIMEOUT": "1s"}, []string{"--redis-timeout", "50ms"}, func(s flags.Serve) error {
			return want("--redis-timeout", s.RedisTimeout, 50*time.Millisecond)
		}},
		// Accepted values and variables the peer itself would not read.
		{"accepted", map[string]string{
			"NEAR_LIMIT_RATIO": "0.80", "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true", "USE_STATSD": "false",
			"STATSD_HOST": "statsd", "STATSD_PORT": "9125", "EXTRA_TAGS": "a:b", "REDIS_PERSECOND": "false", "REDIS_PERSECOND_URL": "x:1",
			"BACKEND_TYPE": "REDIS", "MEMCACHE_HOST_PORT": "m:11211", "CONFIG_TYPE": "file", "CONFIG_GRPC_XDS_SERVER_URL": "xds:18000",
			"LIMIT_LIMIT_HEADER": "X-Limit", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true", "EXPIRATION_JITTER_MAX_SECONDS": "300",
			"TRACING_SERVICE_NAME": "mine", "LOCAL_CACHE_SIZE_IN_BYTES": "1048576", "RESPONSE_DYNAMIC_METADATA": "false", "GRPC_SERVER_USE_TLS": "false",
			"FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true", "STATS_FLUSH_INTERVAL": "1s",
		}, nil, func(s flags.Serve) error {
			return errors.Join(want("--xds-ready-before-rules", s.XDS.ReadyBeforeRules, false), want("--statsd-addr", s.Statsd.Addr, ""))
		}},
		// Kubernetes sets STATSD_PORT=tcp://... for a Service named statsd.
		{"Kubernetes Service links", map[string]string{"STATSD_PORT": "tcp://10.0.0.7:8125", "GRPC_PORT": "tcp://10.0.0.8:8081"}, nil, func(s flags.Serve) error {
			return want("--grpc-addr", s.GRPCAddr, ":8081")
		}},
		{"ignore", map[string]string{"REDIS_PERSECOND": "true", "PORT": "9000"}, []string{"--peer-env", "ignore"}, func(s flags.Serve) error {
			return want("--http-addr", s.HTTPAddr, ":8080")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			s, err := flags.ParseServe(tt.args, envOf(tt.env), &out)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			if err := tt.check(s); err != nil {
				t.Error(err)
			}
			// Every peer variable set leaves a note to log.
			for name := range tt.env {
				if !strings.HasPrefix(name, "RLS_") && !noted(s.PeerNotes, name) {
					t.Errorf("no note about %s: %+v", name, s.PeerNotes)
				}
			}
		})
	}
}

// TestStopCacheKeyIncrementNote: STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT is
// accepted with either value, and its note names the rules that do charge
// a refused hit (postpaid, quota_mode), whose refusal takes what does not fit.
func TestStopCacheKeyIncrementNote(t *testing.T) {
	for _, v := range []string{"true", "false"} {
		var out bytes.Buffer
		s, err := flags.ParseServe(nil, envOf(map[string]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": v}), &out)
		if err != nil {
			t.Fatalf("%s: %v\n%s", v, err, out.String())
		}
		var msg string
		for _, n := range s.PeerNotes {
			if noted([]flags.PeerNote{n}, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT") {
				msg = n.Msg
			}
		}
		for _, word := range []string{"accepted", "refused request takes nothing", "except on postpaid and quota_mode rules"} {
			if !strings.Contains(msg, word) {
				t.Errorf("%s: note %q lacks %q", v, msg, word)
			}
		}
	}
}

func want[T comparable](flag string, got, want T) error {
	if got != want {
		return fmt.Errorf("%s = %v, want %v", flag, got, want)
	}
	return nil
}

// notedAt reports whether a note at level names the variable name.
func notedAt(notes []flags.PeerNote, name string, level slog.Level) bool {
	for _, n := range notes {
		if n.Level == level && noted([]flags.PeerNote{n}, name) {
			return true
		}
	}
	return false
}

func noted(notes []flags.PeerNote, name string) bool {
	for _, n := range notes {
		for i := 0; i+1 < len(n.Args); i += 2 {
			if v, ok := n.Args[i+1].(string); ok && (v == name || strings.Contains(","+v+",", ","+name+",")) {
				return true
			}
		}
	}
	return false
}

// TestPeerEnvRedis: REDIS_* become a --redis that backend/redis parses
// into the same server, credentials and TLS.
func TestPeerEnvRedis(t *testing.T) {
	tests := []struct {
		name   string
		env    map[string]string
		url    string
		addrs  []string
		user   string
		pass   string
		tls    bool
		master string
	}{
		{"single", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379"},
			"redis://redis:6379", []string{"redis:6379"}, "", "", false, ""},
		{"password", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "REDIS_AUTH": "p@ss,w/rd x"},
			"redis://:p%40ss%2Cw%2Frd%20x@redis:6379", []string{"redis:6379"}, "", "p@ss,w/rd x", false, ""},
		// As the peer, the first ':' ends the user name.
		{"user, and a password with a colon", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "REDIS_AUTH": "u:p:w"},
			"redis://u:p%3Aw@redis:6379", []string{"redis:6379"}, "u", "p:w", false, ""},
		{"user and password over TLS with a pool", map[string]string{"REDIS_SOCKET_TYPE": "TCP", "REDIS_URL": "redis:6380", "REDIS_AUTH": "rl:secret", "REDIS_TLS": "true", "REDIS_POOL_SIZE": "20"},
			"rediss://rl:secret@redis:6380?pool_size=20", []string{"redis:6380"}, "rl", "secret", true, ""},
		{"cluster", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "cluster", "REDIS_URL": "n1:6379,n2:6379", "REDIS_AUTH": "pw"},
			"redis://:pw@n1:6379,n2:6379", []string{"n1:6379", "n2:6379"}, "", "pw", false, ""},
		{"cluster from one seed", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "CLUSTER", "REDIS_URL": "n1:6379", "REDIS_POOL_SIZE": "5"},
			"redis://n1:6379?pool_size=5&cluster=true", []string{"n1:6379"}, "", "", false, ""},
		{"sentinel", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379"},
			"sentinel://mymaster@s1:26379,s2:26379", []string{"s1:26379", "s2:26379"}, "", "", false, "mymaster"},
		// The peer reads REDIS_SOCKET_TYPE only for SINGLE: it dials TCP to
		// a Cluster or Sentinel, with the default unix too.
		{"cluster, REDIS_SOCKET_TYPE left at unix", map[string]string{"REDIS_TYPE": "CLUSTER", "REDIS_URL": "n1:6379,n2:6379"},
			"redis://n1:6379,n2:6379", []string{"n1:6379", "n2:6379"}, "", "", false, ""},
		{"sentinel, REDIS_SOCKET_TYPE=unix", map[string]string{"REDIS_SOCKET_TYPE": "unix", "REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,s1:26379"},
			"sentinel://mymaster@s1:26379", []string{"s1:26379"}, "", "", false, "mymaster"},
		{"sentinel with passwords over TLS", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379", "REDIS_AUTH": "pw", "REDIS_SENTINEL_AUTH": "s&pw", "REDIS_TLS": "true", "REDIS_POOL_SIZE": "10"},
			"sentinels://:pw@mymaster@s1:26379?sentinel_password=s%26pw", []string{"s1:26379"}, "", "pw", true, "mymaster"},
		// REDIS_SOCKET_TYPE=unix (the peer's default): REDIS_URL is a
		// socket path, which must be absolute.
		{"unix socket", map[string]string{"REDIS_URL": "/run/redis/redis.sock"},
			"unix:///run/redis/redis.sock", []string{"/run/redis/redis.sock"}, "", "", false, ""},
		{"unix socket with user, password and pool", map[string]string{"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": "/run/redis.sock", "REDIS_AUTH": "rl:p@ss/w rd", "REDIS_POOL_SIZE": "20"},
			"unix://rl:p%40ss%2Fw%20rd@/run/redis.sock?pool_size=20", []string{"/run/redis.sock"}, "rl", "p@ss/w rd", false, ""},
		{"unix socket at the peer's default path", map[string]string{"REDIS_AUTH": "pw"},
			"unix://:pw@/var/run/nutcracker/ratelimit.sock", []string{"/var/run/nutcracker/ratelimit.sock"}, "", "pw", false, ""},
		{"unix socket path with a space, '?', '%' and '#'", map[string]string{"REDIS_SOCKET_TYPE": "UNIX", "REDIS_URL": "/run/my redis/r?%#.sock"},
			"unix:///run/my%20redis/r%3F%25%23.sock", []string{"/run/my redis/r?%#.sock"}, "", "", false, ""},
		{"a URL already", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis://redis:6379/2"},
			"redis://redis:6379/2", []string{"redis:6379"}, "", "", false, ""},
		// A URL is no socket path: REDIS_SOCKET_TYPE's default unix does not apply.
		{"a URL without REDIS_SOCKET_TYPE", map[string]string{"REDIS_URL": "rediss://:pw@redis:6380"},
			"rediss://:pw@redis:6380", []string{"redis:6380"}, "", "pw", true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			s, err := flags.ParseServe(nil, envOf(tt.env), &out)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			if s.Redis != tt.url {
				t.Errorf("--redis %q, want %q", s.Redis, tt.url)
			}
			o, err := redisbackend.ParseURL(s.Redis, 0)
			if err != nil {
				t.Fatalf("backend/redis refuses %q: %v", s.Redis, err)
			}
			if fmt.Sprint(o.Addrs) != fmt.Sprint(tt.addrs) || o.Username != tt.user || o.Password != tt.pass || (o.TLSConfig != nil) != tt.tls || o.MasterName != tt.master {
				t.Errorf("parsed: addrs %v user %q password %q TLS %v master %q; want %v %q %q %v %q",
					o.Addrs, o.Username, o.Password, o.TLSConfig != nil, o.MasterName, tt.addrs, tt.user, tt.pass, tt.tls, tt.master)
			}
			if ps := tt.env["REDIS_POOL_SIZE"]; ps != "" && tt.master == "" && fmt.Sprint(o.PoolSize) != ps {
				t.Errorf("pool size %d, want %s", o.PoolSize, ps)
			}
			if tt.env["REDIS_SENTINEL_AUTH"] != "" && o.SentinelPassword != tt.env["REDIS_SENTINEL_AUTH"] {
				t.Errorf("sentinel password %q, want %q", o.SentinelPassword, tt.env["REDIS_SENTINEL_AUTH"])
			}
			// Passwords never reach the log.
			for _, n := range s.PeerNotes {
				if line := fmt.Sprint(n.Msg, n.Args); tt.pass != "" && strings.Contains(line, tt.pass) {
					t.Errorf("note %q shows the password", line)
				}
			}
		})
	}
}

// TestPeerEnvRefusals: each variable rls serve cannot honour stops it with
// a message naming the flag to use or why there is none.
func TestPeerEnvRefusals(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want []string // the lines of the error, after its first
	}{
		{"per-second Redis", map[string]string{"REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "r2:6379", "REDIS_PERSECOND_SOCKET_TYPE": "tcp"}, nil, []string{
			`REDIS_PERSECOND="true": not supported: sluice has no second Redis for per-second limits: one Redis, Sentinel or Redis Cluster holds every bucket (a token bucket is one key per limit, not one per window), and a per-second rule can carry a per-node local bucket that never calls Redis`,
			`REDIS_PERSECOND_SOCKET_TYPE="tcp": not supported: sluice has no second Redis for per-second limits: one Redis, Sentinel or Redis Cluster holds every bucket (a token bucket is one key per limit, not one per window), and a per-second rule can carry a per-node local bucket that never calls Redis`,
			`REDIS_PERSECOND_URL=(not shown): not supported: sluice has no second Redis for per-second limits: one Redis, Sentinel or Redis Cluster holds every bucket (a token bucket is one key per limit, not one per window), and a per-second rule can carry a per-node local bucket that never calls Redis`,
		}},
		{"memcache", map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "m:11211", "REDIS_URL": "ignored:6379"}, nil, []string{
			`BACKEND_TYPE="memcache": not supported: sluice has no memcache backend: a token bucket needs an atomic read-modify-write (a Lua script on Redis), which memcache's increments cannot do`,
			`MEMCACHE_HOST_PORT="m:11211": not supported: sluice has no memcache backend: a token bucket needs an atomic read-modify-write (a Lua script on Redis), which memcache's increments cannot do`,
		}},
		{"DogStatsD", map[string]string{"USE_STATSD": "false", "USE_DOG_STATSD": "true", "USE_DOG_STATSD_MOGRIFIERS": "X"}, nil, []string{
			`USE_DOG_STATSD="true": not supported: sluice sends plain statsd (USE_STATSD, --statsd-addr), not DogStatsD's tags`,
			`USE_DOG_STATSD_MOGRIFIERS="X": not supported: sluice sends plain statsd (USE_STATSD, --statsd-addr), not DogStatsD's tags`,
		}},
		{"statsd tags", map[string]string{"USE_STATSD": "true", "EXTRA_TAGS": "a:b"}, nil, []string{
			`EXTRA_TAGS="a:b": not supported: sluice adds no constant labels or tags to its metrics: add them when scraping (Prometheus relabel_configs or the ServiceMonitor's) or in the statsd server`,
		}},
		{"Redis timeout", map[string]string{"REDIS_TIMEOUT": "10s"}, nil, []string{
			`REDIS_TIMEOUT="10s": not the same timeout: sluice's --redis-timeout (default 10ms) bounds every Redis call, after which the node answers from its fallback; the peer's bounds connections and I/O and then fails the request; give --redis-timeout instead`,
		}},
		{"debug port", map[string]string{"DEBUG_PORT": "6070"}, nil, []string{
			`DEBUG_PORT="6070": the peer's debug listener (pprof, /rlconfig, /stats) has no equal: sluice serves /rlconfig on --http-addr, and pprof (with --pprof) and /json on --admin-addr, which should not be reachable from the network; give --admin-addr instead`,
		}},
		{"near limit ratio", map[string]string{"NEAR_LIMIT_RATIO": "0.9"}, nil, []string{
			`NEAR_LIMIT_RATIO="0.9": not supported: sluice's near_limit is fixed: allowed with less than 20% of the burst left`,
		}},
		{"xDS TLS without a CA", map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_NODE_METADATA": "a:b"}, nil, []string{
			`CONFIG_GRPC_XDS_NODE_METADATA="a:b": not supported: sluice's xDS client sends no node metadata (--xds-node-id and --xds-node-cluster name the node)`,
			`CONFIG_GRPC_XDS_SERVER_USE_TLS=true without CONFIG_GRPC_XDS_SERVER_TLS_CACERT: sluice's xDS client uses TLS only with a CA bundle; give --xds-tls-ca`,
		}},
		{"unix socket with TLS", map[string]string{"REDIS_URL": "/run/redis.sock", "REDIS_TLS": "true"}, nil, []string{
			`REDIS_TLS=true with REDIS_SOCKET_TYPE=unix: unix:// in --redis speaks plain Redis, without TLS`,
		}},
		{"relative unix socket path", map[string]string{"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": "run/redis.sock"}, nil, []string{
			`REDIS_SOCKET_TYPE=unix: REDIS_URL must be the socket's absolute path (/path/redis.sock) for unix:// in --redis`,
		}},
		{"Redis host name not checked", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_TLS": "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"}, nil, []string{
			`REDIS_TLS_SKIP_HOSTNAME_VERIFICATION="true": not supported: sluice checks Redis' certificate and its host name; rediss://…?skip_verify=true in --redis skips every check, not only the name: give Redis a certificate that names the host instead`,
		}},
		// The peer checks one host name: a list or a URI matches no client
		// there, and would widen what --tls-client-san accepts.
		{"client SAN list", map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c", "GRPC_SERVER_TLS_KEY": "k", "GRPC_CLIENT_TLS_CACERT": "ca", "GRPC_CLIENT_TLS_SAN": "a.example,b.example"}, nil, []string{
			`GRPC_CLIENT_TLS_SAN="a.example,b.example": the peer checks it as one host name, which no client certificate matches; --tls-client-san would read a list or a URI SAN: give --tls-client-san yourself`,
		}},
		{"client SAN URI", map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c", "GRPC_SERVER_TLS_KEY": "k", "GRPC_CLIENT_TLS_CACERT": "ca", "GRPC_CLIENT_TLS_SAN": "spiffe://cluster.local/ns/edge/sa/envoy"}, nil, []string{
			`GRPC_CLIENT_TLS_SAN="spiffe://cluster.local/ns/edge/sa/envoy": the peer checks it as one host name, which no client certificate matches; --tls-client-san would read a list or a URI SAN: give --tls-client-san yourself`,
		}},
		{"TLS without a certificate", map[string]string{"GRPC_SERVER_USE_TLS": "true"}, nil, []string{
			`GRPC_SERVER_USE_TLS=true without GRPC_SERVER_TLS_CERT: give --tls-cert and --tls-key`,
		}},
		{"tracing protocol", map[string]string{"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": "thrift", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318"}, nil, []string{
			`TRACING_EXPORTER_PROTOCOL="thrift": want http or grpc`,
		}},
		{"not a boolean", map[string]string{"SHADOW_MODE": "yes", "REDIS_POOL_SIZE": "many", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1"}, nil, []string{
			`REDIS_POOL_SIZE="many" is not a number`,
			`SHADOW_MODE="yes" is not a boolean`,
		}},
		{"bad log level", map[string]string{"LOG_LEVEL": "verbose"}, nil, []string{
			`LOG_LEVEL="verbose" is not a level (trace, debug, info, warn, error, fatal or panic)`,
		}},
		{"secrets", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1", "REDIS_AUTH": "hunter2", "REDIS_SENTINEL_AUTH": "hunter3"}, nil, []string{
			`REDIS_SENTINEL_AUTH is set but REDIS_TYPE=SINGLE: unset it`,
		}},
		{"refuse mode", map[string]string{"REDIS_URL": "r:6379", "REDIS_AUTH": "hunter2", "NEAR_LIMIT_RATIO": "0.8"}, []string{"--peer-env=refuse"}, []string{
			`NEAR_LIMIT_RATIO="0.8": an envoyproxy/ratelimit setting (--peer-env=refuse): not supported`,
			`REDIS_URL=(not shown): an envoyproxy/ratelimit setting (--peer-env=refuse): use --redis`,
			`REDIS_AUTH=(not shown): an envoyproxy/ratelimit setting (--peer-env=refuse): use --redis`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			_, err := flags.ParseServe(tt.args, envOf(tt.env), &out)
			if err == nil {
				t.Fatalf("ParseServe succeeded")
			}
			lines := strings.Split(err.Error(), "\n")
			if !strings.HasPrefix(lines[0], "envoyproxy/ratelimit settings in the environment that rls serve does not honour") {
				t.Errorf("first line %q", lines[0])
			}
			got := lines[1:]
			for i := range got {
				got[i] = strings.TrimPrefix(got[i], "  ")
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("refusals:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			if !strings.Contains(out.String(), lines[1]) {
				t.Errorf("not printed: %q", out.String())
			}
			for _, secret := range []string{"hunter2", "hunter3"} {
				if strings.Contains(out.String(), secret) {
					t.Errorf("printed a password: %q", out.String())
				}
			}
		})
	}
}

// TestEnvoyGatewayTracing: the variables Envoy Gateway adds to its
// rate-limit container when rateLimit.telemetry.tracing is set turn
// tracing on, as they do for envoyproxy/ratelimit: OTLP over HTTP/protobuf
// (the peer's default) to OTEL_EXPORTER_OTLP_ENDPOINT, the spans named by
// TRACING_SERVICE_*. Without a collector, or with TRACING_ENABLED=false,
// they do not (on main: rls serve exited 2 on TRACING_ENABLED=true).
func TestEnvoyGatewayTracing(t *testing.T) {
	c := egtest.Load(t)
	tracingOn := map[string]string{
		"TRACING_ENABLED": "true", "TRACING_SERVICE_NAME": "envoy-ratelimit", "TRACING_SERVICE_NAMESPACE": "envoy-gateway-system",
		"TRACING_SERVICE_INSTANCE_ID": "envoy-ratelimit-7c9f4-x2x9z", "TRACING_SAMPLING_RATE": "1.0",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://trace-collector.envoy-gateway-system.svc.cluster.local:4318",
	}
	var out bytes.Buffer
	s, err := flags.ParseServe(c.Args, c.Getenv(tracingOn), &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	resource, _ := s.TracingResource.MarshalText()
	if err := errors.Join(
		want("--tracing-endpoint", s.TracingEndpoint, "http://trace-collector.envoy-gateway-system.svc.cluster.local:4318/v1/traces"),
		want("--tracing-protocol", s.TracingProtocol, tracing.ProtocolHTTP), want("--tracing-sample-ratio", s.TracingSampleRatio, 1.0),
		want("--tracing-resource", string(resource), "service.name=envoy-ratelimit,service.namespace=envoy-gateway-system,service.instance.id=envoy-ratelimit-7c9f4-x2x9z"),
	); err != nil {
		t.Error(err)
	}
	grpcOn := maps.Clone(tracingOn)
	grpcOn["TRACING_EXPORTER_PROTOCOL"] = "grpc"
	grpcOn["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf" // the peer's variable wins, as in the peer
	grpcOn["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://collector:4317"
	if s, err := flags.ParseServe(c.Args, c.Getenv(grpcOn), &out); err != nil {
		t.Errorf("TRACING_EXPORTER_PROTOCOL=grpc: %v", err)
	} else if err := errors.Join(want("--tracing-protocol", s.TracingProtocol, tracing.ProtocolGRPC), want("--tracing-endpoint", s.TracingEndpoint, "http://collector:4317")); err != nil {
		t.Errorf("TRACING_EXPORTER_PROTOCOL=grpc: %v", err)
	}

	noCollector := maps.Clone(tracingOn)
	delete(noCollector, "OTEL_EXPORTER_OTLP_ENDPOINT")
	if _, err := flags.ParseServe(c.Args, c.Getenv(noCollector), &out); err == nil || !strings.Contains(err.Error(), "TRACING_ENABLED=true (envoyproxy/ratelimit) names no collector: set OTEL_EXPORTER_OTLP_ENDPOINT") {
		t.Errorf("TRACING_ENABLED=true without a collector: %v", err)
	}
	if s, err := flags.ParseServe(append([]string{"--tracing-endpoint", "otel:4317", "--tracing-protocol", "grpc"}, c.Args...), c.Getenv(noCollector), &out); err != nil || s.TracingEndpoint != "otel:4317" || s.TracingProtocol != tracing.ProtocolGRPC {
		t.Errorf("TRACING_ENABLED=true with --tracing-endpoint: %q %q %v", s.TracingEndpoint, s.TracingProtocol, err)
	}

	off := maps.Clone(tracingOn)
	off["TRACING_ENABLED"] = "false"
	if s, err := flags.ParseServe(c.Args, c.Getenv(off), &out); err != nil || s.TracingEndpoint != "" {
		t.Errorf("TRACING_ENABLED=false with OTEL_EXPORTER_OTLP_ENDPOINT: tracing to %q (%v), want off as the peer", s.TracingEndpoint, err)
	}
}

// TestExampleRulesInKubernetes: without --config, rls serve refuses to
// serve the embedded example rules in a Kubernetes pod unless told to.
func TestExampleRulesInKubernetes(t *testing.T) {
	k8s := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
	var out bytes.Buffer
	if _, err := flags.ParseServe(nil, envOf(k8s), &out); err == nil || !strings.Contains(out.String(), "give --config or --xds-server, or --example-rules to serve the examples anyway") {
		t.Errorf("no --config in Kubernetes: %v, printed %q; want a refusal naming --config and --example-rules", err, out.String())
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{nil, nil}, // not in Kubernetes: the README's first command
		{[]string{"--example-rules"}, k8s},
		{[]string{"--config", "rules"}, k8s},
		{nil, map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "RLS_EXAMPLE_RULES": "true"}},
		{nil, map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "RUNTIME_ROOT": "/srv/runtime_data/current"}},
		{[]string{"--xds-server", "eg:18000"}, k8s},
		{nil, map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "CONFIG_TYPE": "GRPC_XDS_SOTW"}},
	} {
		if _, err := flags.ParseServe(tc.args, envOf(tc.env), &out); err != nil {
			t.Errorf("args %q env %v: %v", tc.args, tc.env, err)
		}
	}
}

// TestEnvoyGatewayDeployment: the environment of the rate-limit Deployment
// Envoy Gateway generates is accepted as it is, and means what it means to
// the peer: rules over xDS with mTLS to Envoy Gateway, TLS towards Envoy,
// Redis, ready before the first update.
func TestEnvoyGatewayDeployment(t *testing.T) {
	c := egtest.Load(t)
	var out bytes.Buffer
	s, err := flags.ParseServe(c.Args, c.Getenv(nil), &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	err = errors.Join(
		want("--xds-server", s.XDS.Server, "envoy-gateway:18001"), want("--xds-node-id", s.XDS.NodeID, "envoy-ratelimit"),
		want("--xds-tls-ca", s.XDS.TLSCA, "/certs/ca.crt"), want("--xds-tls-cert", s.XDS.TLSCert, "/certs/tls.crt"), want("--xds-tls-key", s.XDS.TLSKey, "/certs/tls.key"),
		want("--xds-ready-before-rules", s.XDS.ReadyBeforeRules, true), want("--config", s.Config, ""),
		want("--tls-cert", s.TLSCert, "/certs/tls.crt"), want("--tls-key", s.TLSKey, "/certs/tls.key"), want("--tls-client-ca", s.TLSClientCA, ""),
		want("--redis", s.Redis, "redis://redis.redis.svc:6379"), want("--log-level", s.LogLevel, slog.LevelInfo),
		// Its probes and ports: HTTP 8080, gRPC 8081.
		want("--http-addr", s.HTTPAddr, fmt.Sprintf(":%d", c.ReadinessProbe.HTTPGet.Port)), want("--grpc-addr", s.GRPCAddr, ":8081"),
		want("readiness probe path", c.ReadinessProbe.HTTPGet.Path, "/healthcheck"),
		// Where its pod annotations and Service send Prometheus.
		want("--metrics-addr", s.MetricsAddr, ":19001"), want("--metrics-path", s.MetricsPath, "/metrics"),
	)
	if err != nil {
		t.Error(err)
	}
	for _, e := range c.Env {
		if !noted(s.PeerNotes, e.Name) {
			t.Errorf("no note about %s", e.Name)
		}
	}
}
