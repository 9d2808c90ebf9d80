package health

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/rediserr"
)

var errOpen = errors.New("circuit open")

// unusedClient is a client of addr that the test never sends a command
// through, closed when the test ends.
func unusedClient(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func logged(t *testing.T) (*State, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	h := New(unusedClient(t, "203.0.113.1:6379"))
	l := Logger{L: slog.New(slog.NewTextHandler(&buf, nil))}
	h.Register(l)
	h.Register(l) // a logger shared by two caches logs once
	return h, &buf
}

func TestOutageIsLoggedOnceAndItsEnd(t *testing.T) {
	h, buf := logged(t)
	down := errors.New("dial tcp: refused")
	for range 3 {
		h.Learn(rediserr.Outage, down)
	}
	h.Learn(rediserr.None, nil)
	h.Learn(rediserr.None, nil)
	out := buf.String()
	if n := strings.Count(out, "redis unreachable"); n != 1 {
		t.Errorf("outage logged %d times; want once:\n%s", n, out)
	}
	if n := strings.Count(out, "redis answers again"); n != 1 {
		t.Errorf("recovery logged %d times; want once:\n%s", n, out)
	}
	if !strings.Contains(out, "203.0.113.1:6379") {
		t.Errorf("the address is not named:\n%s", out)
	}
}

func TestMemoryPressureIsOneEpisode(t *testing.T) {
	h, buf := logged(t)
	oom := errors.New("OOM command not allowed")
	h.Learn(rediserr.Full, oom)
	h.Learn(rediserr.Full, oom)
	if h.Episode() != 1 || strings.Count(buf.String(), "out of memory") != 1 {
		t.Errorf("episode %d, log:\n%s; want one episode logged once", h.Episode(), buf)
	}
}

func TestUnregisteredLoggerIsQuiet(t *testing.T) {
	var buf bytes.Buffer
	h := New(unusedClient(t, "203.0.113.1:6379"))
	l := Logger{L: slog.New(slog.NewTextHandler(&buf, nil))}
	h.Register(l)
	h.Unregister(l)
	h.Learn(rediserr.Outage, errors.New("down"))
	if buf.Len() != 0 {
		t.Errorf("logged after Unregister: %s", buf.String())
	}
}

func TestBreakerOpensProbesAndCloses(t *testing.T) {
	h := New(unusedClient(t, "203.0.113.1:6379"))
	b := NewBreaker(3, 20*time.Millisecond, h, errOpen)
	var heard []bool
	stop := b.Listen(func(open bool, key string, err error) { heard = append(heard, open) })
	down := errors.New("i/o timeout")
	for range 2 {
		b.Record("k", rediserr.Outage, down)
	}
	b.Record("k", rediserr.Full, down) // a full Redis is up: it resets the count
	for range 2 {
		b.Record("k", rediserr.Outage, down)
	}
	if b.Open() {
		t.Fatal("open before 3 consecutive outages")
	}
	b.Record("k", rediserr.Outage, down)
	if !b.Open() || b.Allow() {
		t.Fatal("not open after 3 consecutive outages")
	}
	if err := b.Err(); !errors.Is(err, errOpen) || !strings.Contains(err.Error(), "203.0.113.1:6379") || !strings.Contains(err.Error(), "i/o timeout") {
		t.Errorf("Err() = %v; want errOpen naming the address and the failure", err)
	}
	time.Sleep(25 * time.Millisecond)
	if !b.Allow() || b.Allow() {
		t.Error("want one probe per cool-down")
	}
	b.Record("k", rediserr.None, nil)
	if b.Open() || !b.Allow() {
		t.Error("a successful probe did not close it")
	}
	if len(heard) != 2 || !heard[0] || heard[1] {
		t.Errorf("transitions heard %v; want [true false]", heard)
	}
	stop()
	for range 3 {
		b.Record("k", rediserr.Outage, down)
	}
	if len(heard) != 2 {
		t.Error("heard after stop")
	}
}

func TestBreakerOff(t *testing.T) {
	b := NewBreaker(0, 0, New(unusedClient(t, "")), errOpen)
	for range 100 {
		b.Record("k", rediserr.Outage, errors.New("down"))
	}
	if b.Open() || !b.Allow() || b.Err() != errOpen {
		t.Error("a breaker with threshold 0 opened")
	}
}

func TestAddr(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"b": "h2:1", "a": "h1:1"}})
	defer ring.Close()
	if got := Addr(ring); got != "h1:1,h2:1" {
		t.Errorf("Addr(ring) = %q", got)
	}
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"s1:1", "s2:1"}})
	defer cl.Close()
	if got := Addr(cl); got != "s1:1,s2:1" {
		t.Errorf("Addr(cluster) = %q", got)
	}
}
