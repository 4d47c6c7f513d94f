package redis

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// ParseURL turns a --redis value into go-redis options for
// goredis.NewUniversalClient:
//
//	redis://[user:pass@]host:port[/db]            one Redis
//	rediss://[user:pass@]host:port[/db]           one Redis over TLS
//	unix://[user:pass@]/path/redis.sock[?db=N]    one Redis on a unix socket
//	host:port                                     one Redis
//	redis://h1:p1,redis://h2:p2 or h1:p1,h2:p2    Redis Cluster (seed nodes)
//	redis://host:port?cluster=true                Redis Cluster from one seed
//	sentinel://[user:pass@]master@h1:p1,h2:p2[/db] Sentinel (sentinels:// for TLS)
//
// For a single Redis, go-redis' URL query parameters apply (pool_size,
// dial_timeout, ...). In a cluster list, credentials, TLS and parameters come
// from the first element with a scheme. Sentinel takes the query parameters
// sentinel_username and sentinel_password for the sentinels themselves; the
// URL's user and password are the master's. Percent-encode ',', '@' and '/'
// in user names and passwords.
//
// The options enforce deadlines from contexts (ContextTimeoutEnabled); read,
// write and pool timeouts of max(10×timeout, 100ms) are backstops for calls
// without a deadline (DefaultTimeout when timeout <= 0). Command retries and
// dial retries are off unless the URL sets max_retries or dialer_retries. Errors never repeat a password.
func ParseURL(s string, timeout time.Duration) (*goredis.UniversalOptions, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	var o *goredis.UniversalOptions
	var err error
	switch {
	case strings.TrimSpace(s) == "":
		err = errors.New("empty address")
	case strings.HasPrefix(s, "sentinel://"), strings.HasPrefix(s, "sentinels://"):
		o, err = parseSentinel(s)
	case strings.Contains(s, ","):
		o, err = parseCluster(s)
	default:
		o, err = parseSingle(s)
	}
	if err != nil {
		// err never holds the address: the parsers' messages name the
		// part at fault, and url.Parse's errors (which quote the whole
		// URL) are replaced by messages of their own. The address is shown
		// with its passwords hidden by position (redact), never by
		// searching the message for them.
		return nil, fmt.Errorf("backend/redis: parse redis address %q: %v", redact(s), err)
	}
	o.ContextTimeoutEnabled = true
	if o.MaxRetries == 0 {
		// A retry's backoff (8ms at least) does not fit in the deadline: it
		// would turn a refused connection into a timeout. The caller's
		// fallback handles failures, and go-redis checks idle connections
		// before reuse.
		o.MaxRetries = -1
	}
	if o.DialerRetries == 0 {
		o.DialerRetries = 1 // one dial attempt: its 100ms backoff would hide a refused connection behind a timeout
	}
	backstop := max(10*timeout, 100*time.Millisecond)
	if o.ReadTimeout == 0 {
		o.ReadTimeout = backstop
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = backstop
	}
	if o.PoolTimeout == 0 {
		o.PoolTimeout = backstop
	}
	return o, nil
}

// parseSingle reads one redis:// or rediss:// URL, or a bare host:port.
func parseSingle(s string) (*goredis.UniversalOptions, error) {
	if !strings.Contains(s, "://") {
		if err := checkHostPort(s); err != nil {
			return nil, err
		}
		return &goredis.UniversalOptions{Addrs: []string{s}}, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, errors.New("not a URL")
	}
	q := u.Query()
	cluster := false
	if v := q.Get("cluster"); v != "" {
		if cluster, err = strconv.ParseBool(v); err != nil {
			return nil, fmt.Errorf("cluster=%q is not a boolean", v)
		}
		q.Del("cluster")
		u.RawQuery = q.Encode()
	}
	o, err := fromURL(u)
	if err != nil {
		return nil, err
	}
	if cluster {
		if u.Scheme == "unix" {
			return nil, errors.New("cluster=true needs host:port seeds, not a unix socket")
		}
		if o.DB != 0 {
			return nil, fmt.Errorf("database %d requested, but Redis Cluster has only database 0", o.DB)
		}
		o.IsClusterMode = true
	}
	return o, nil
}

// fromURL converts a redis://, rediss:// or unix:// URL with go-redis' own
// parser.
func fromURL(u *url.URL) (*goredis.UniversalOptions, error) {
	switch u.Scheme {
	case "redis", "rediss":
		if u.Host == "" {
			return nil, errors.New("missing host")
		}
	case "unix":
		// go-redis dials an address starting with '/' over a unix socket.
		if u.Host != "" || !strings.HasPrefix(u.Path, "/") {
			return nil, errors.New("want unix:///absolute/path/redis.sock")
		}
	default:
		return nil, fmt.Errorf("unknown scheme %q (want redis, rediss, unix or sentinel)", u.Scheme)
	}
	p, err := goredis.ParseURL(u.String())
	if err != nil {
		return nil, err
	}
	return &goredis.UniversalOptions{
		Addrs:           []string{p.Addr},
		ClientName:      p.ClientName,
		DB:              p.DB,
		Protocol:        p.Protocol,
		Username:        p.Username,
		Password:        p.Password,
		MaxRetries:      p.MaxRetries,
		MinRetryBackoff: p.MinRetryBackoff,
		MaxRetryBackoff: p.MaxRetryBackoff,
		DialTimeout:     p.DialTimeout,
		DialerRetries:   p.DialerRetries,
		ReadTimeout:     p.ReadTimeout,
		WriteTimeout:    p.WriteTimeout,
		PoolFIFO:        p.PoolFIFO,
		PoolSize:        p.PoolSize,
		PoolTimeout:     p.PoolTimeout,
		MinIdleConns:    p.MinIdleConns,
		MaxIdleConns:    p.MaxIdleConns,
		MaxActiveConns:  p.MaxActiveConns,
		ConnMaxIdleTime: p.ConnMaxIdleTime,
		ConnMaxLifetime: p.ConnMaxLifetime,
		TLSConfig:       p.TLSConfig,
	}, nil
}

// parseCluster reads a comma list of seed nodes.
func parseCluster(s string) (*goredis.UniversalOptions, error) {
	var o *goredis.UniversalOptions
	var addrs []string
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, errors.New("empty element in the node list")
		}
		if !strings.Contains(part, "://") {
			if err := checkHostPort(part); err != nil {
				return nil, err
			}
			addrs = append(addrs, part)
			continue
		}
		u, err := url.Parse(part)
		if err != nil {
			return nil, errors.New("an element is not a URL")
		}
		if u.Scheme == "unix" {
			return nil, errors.New("a Redis Cluster node list takes host:port nodes, not unix sockets")
		}
		p, err := fromURL(u)
		if err != nil {
			return nil, err
		}
		if p.DB != 0 {
			return nil, fmt.Errorf("database %d requested, but Redis Cluster has only database 0", p.DB)
		}
		if o == nil {
			o = p
		}
		addrs = append(addrs, p.Addrs[0])
	}
	if o == nil {
		o = &goredis.UniversalOptions{}
	}
	o.Addrs = addrs
	o.IsClusterMode = true
	return o, nil
}

// parseSentinel reads sentinel[s]://[user:pass@]master@h1:p1,h2:p2[/db][?query].
func parseSentinel(s string) (*goredis.UniversalOptions, error) {
	scheme, rest, _ := strings.Cut(s, "://")
	rest, query, _ := strings.Cut(rest, "?")
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return nil, errors.New("missing master name (sentinel://master@host:port,...)")
	}
	head, hosts := rest[:at], rest[at+1:]
	o := &goredis.UniversalOptions{}
	hosts, db, hasDB := strings.Cut(hosts, "/")
	if hasDB && db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("database %q is not a number", db)
		}
		o.DB = n
	}
	master := head
	if i := strings.LastIndex(head, "@"); i >= 0 {
		user, pass, _ := strings.Cut(head[:i], ":")
		var err error
		if o.Username, err = url.PathUnescape(user); err != nil {
			return nil, errors.New("bad escape in the user name")
		}
		if o.Password, err = url.PathUnescape(pass); err != nil {
			return nil, errors.New("bad escape in the password")
		}
		master = head[i+1:]
	}
	master, err := url.PathUnescape(master)
	if err != nil || master == "" {
		return nil, errors.New("missing master name (sentinel://master@host:port,...)")
	}
	o.MasterName = master
	for h := range strings.SplitSeq(hosts, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return nil, errors.New("empty element in the sentinel list")
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, "26379")
		}
		if err := checkHostPort(h); err != nil {
			return nil, err
		}
		o.Addrs = append(o.Addrs, h)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, errors.New("bad query")
	}
	for k, v := range q {
		switch k {
		case "sentinel_username":
			o.SentinelUsername = v[len(v)-1]
		case "sentinel_password":
			o.SentinelPassword = v[len(v)-1]
		default:
			return nil, fmt.Errorf("unknown sentinel parameter %q", k)
		}
	}
	switch scheme {
	case "sentinels":
		host, _, _ := net.SplitHostPort(o.Addrs[0])
		o.TLSConfig = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	case "sentinel":
	}
	return o, nil
}

func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return fmt.Errorf("%q is not host:port", s)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("bad port in %q", s)
	}
	return nil
}

// redact hides the passwords in s: "user:pass@" becomes "user:xxxxx@", and
// "sentinel_password=pass" becomes "sentinel_password=xxxxx".
func redact(s string) string {
	s = redactUserinfo(s)
	q := strings.IndexByte(s, '?')
	if q < 0 {
		return s
	}
	b := []byte(s[:q])
	for rest := s[q:]; rest != ""; {
		i := strings.Index(rest, "password=")
		if i < 0 {
			b = append(b, rest...)
			break
		}
		i += len("password=")
		b = append(append(b, rest[:i]...), "xxxxx"...)
		rest = rest[i:]
		if end := strings.IndexAny(rest, "&,"); end >= 0 {
			rest = rest[end:]
		} else {
			rest = ""
		}
	}
	return string(b)
}

// redactUserinfo hides the passwords of the userinfo parts of s.
func redactUserinfo(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s // bare host:port lists carry no password
	}
	if scheme == "sentinel" || scheme == "sentinels" {
		// sentinel://user:pass@master@hosts: the userinfo ends at the
		// second-to-last '@'.
		head, _, _ := strings.Cut(rest, "?")
		last := strings.LastIndex(head, "@")
		if last < 0 {
			return s
		}
		at := strings.LastIndex(head[:last], "@")
		if at < 0 {
			return s
		}
		return scheme + "://" + hidePassword(rest[:at]) + rest[at:]
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		scheme, rest, ok := strings.Cut(p, "://")
		if !ok {
			continue
		}
		end := strings.IndexAny(rest, "/?")
		if end < 0 {
			end = len(rest)
		}
		if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
			parts[i] = scheme + "://" + hidePassword(rest[:at]) + rest[at:]
		}
	}
	return strings.Join(parts, ",")
}

func hidePassword(userinfo string) string {
	if user, _, ok := strings.Cut(userinfo, ":"); ok {
		return user + ":xxxxx"
	}
	return userinfo
}
