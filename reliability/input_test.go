// This file feeds the cache bad input: empty, huge and odd-byte keys,
// values the codec rejects, data at the key that is not a record of ours,
// huge values and invalid options. Each must give a clear error or a correct
// value; nothing may panic or hang.
package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stampede-go/stampede/lock"
)

func TestEmptyKeyAndNilLoader(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	p := redistest.Prefix(t, direct)
	c := cache.New[string](direct, cache.WithPrefix(p))
	ctx := context.Background()
	load := func(context.Context) (string, error) { t.Error("loader called"); return "", nil }

	if _, err := c.GetOrLoad(ctx, "", load); !errors.Is(err, cache.ErrEmptyKey) {
		t.Errorf(`GetOrLoad("") = %v; want ErrEmptyKey`, err)
	}
	if _, err := c.GetOrLoad(ctx, "k", nil); !errors.Is(err, cache.ErrNilLoader) {
		t.Errorf("GetOrLoad(nil loader) = %v; want ErrNilLoader", err)
	}
	if _, err := lock.Obtain(ctx, direct, "", time.Second); !errors.Is(err, lock.ErrEmptyKey) {
		t.Errorf(`Obtain("") = %v; want ErrEmptyKey`, err)
	}
	// Delete checks every key before deleting any: nothing is lost to a
	// half-done call.
	direct.Set(ctx, p+"a", "x", 0)
	if err := c.Delete(ctx, "a", ""); !errors.Is(err, cache.ErrEmptyKey) {
		t.Errorf(`Delete("a", "") = %v; want ErrEmptyKey`, err)
	}
	if n := direct.Exists(ctx, p+"a").Val(); n != 1 {
		t.Errorf("after a rejected Delete, key a exists = %d; want 1", n)
	}
}

// TestOddKeys stores and deletes keys made of awkward bytes, including the
// braces that decide Redis Cluster hash tags, and keys up to 1MB.
func TestOddKeys(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	keys := map[string]string{
		"binary":       "\x00\x01\xfe\xff",
		"space":        "with space",
		"newline":      "line\nbreak\r\n",
		"tag":          "{user:1}profile",
		"empty-tag":    "{}x",
		"close-open":   "}{",
		"unmatched-}":  "a}b",
		"unmatched-{":  "{a",
		"trailing-{":   "x{",
		"nested":       "{{a}}",
		"glob":         `*?[a-z]\`,
		"utf8":         "日本語🙂",
		"invalid-utf8": "\xc3\x28",
		"1KiB":         strings.Repeat("k", 1<<10),
		"64KiB":        strings.Repeat("k", 64<<10),
		"1MiB":         strings.Repeat("k", 1<<20),
	}
	for name, k := range keys {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each waits out one near-cache lease (1s) for its new prefix
			ctx := context.Background()
			p := redistest.Prefix(t, direct)
			cs := procs(t, 2, addr, nil, cache.WithPrefix(p), cache.WithRetry(100, 20*time.Millisecond))
			src := newSource(20 * time.Millisecond)
			start := time.Now()
			out := stampede(t, cs, 5, k, "v", src.loader(k, "v"))
			if out.ok != 10 || src.loads(k) != 1 {
				t.Errorf("callers: %v, loads=%d; want 10 ok and 1 load", out, src.loads(k))
			}
			if got := stored(t, direct, p+k); got != `"v"` {
				t.Errorf("value at exactly prefix+key = %s; want %q", got, `"v"`)
			}
			if err := cs[0].Delete(ctx, k); err != nil {
				t.Errorf("Delete: %v", err)
			}
			if n := direct.Exists(ctx, p+k).Val(); n != 0 {
				t.Errorf("after Delete: EXISTS = %d; want 0", n)
			}
			if v, err := cs[1].GetOrLoad(ctx, k, src.loader(k, "v2")); err != nil || v != "v2" {
				t.Errorf("after Delete: GetOrLoad = %q, %v; want a fresh load", v, err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("took %v", took)
			}
		})
	}
}

// TestLongKeyWithUnmatchedBrace guards a fixed bug: a key with a '}' and no
// hash tag used to make lockKey search ~16384 suffixes, rehashing the whole
// key for each (1m46s for a 100KB key, outside any context). The test picks
// the filler whose key the old search would have tried longest and checks
// that Delete and GetOrLoad stay fast and that the lock shares the slot.
func TestLongKeyWithUnmatchedBrace(t *testing.T) {
	// Not parallel: it bounds a call's time.
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	const prefix = "stampedetest:long-brace-key:"
	var key string
	best := -1
	for c := byte('a'); c <= 'z'; c++ {
		k := strings.Repeat(string(c), 64<<10) + "}"
		if n := suffixTries(prefix + k); n > best {
			best, key = n, k
		}
	}
	t.Cleanup(func() { redistest.DeletePrefix(direct, prefix) })
	// The first write of a new prefix waits out one lease (a new lease
	// registry may have forgotten leases), which is not what this test
	// times: the registry is made old first.
	if err := direct.HSet(context.Background(), coherence.RegistryKey(prefix), "~since", 0).Err(); err != nil {
		t.Fatal(err)
	}
	c := cache.New[string](direct, cache.WithPrefix(prefix), cache.WithoutNearCache())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := c.Delete(ctx, key); err != nil {
		t.Errorf("Delete: %v", err)
	}
	if v, err := c.GetOrLoad(ctx, key, func(context.Context) (string, error) { return "v", nil }); err != nil || v != "v" {
		t.Errorf("GetOrLoad = %q, %v", v, err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Delete+GetOrLoad of a 64KiB key with a '}' took %v (the old search: %d tries); want well under 1s",
			took.Round(time.Millisecond), best)
	}
	t.Logf("figures: 64KiB key with an unmatched '}' (old search: %d tries): Delete+GetOrLoad %v",
		best, time.Since(start).Round(time.Millisecond))
}

// suffixTries is how many suffixes the old lockKey search (before the fix)
// hashed for key before one landed in the key's slot.
func suffixTries(key string) int {
	base := crcUpdate(0, key)
	slot := base % 16384
	for n := 0; ; n++ {
		if crcUpdate(base, ":lock:"+strconv.Itoa(n))%16384 == slot {
			return n + 1
		}
	}
}

// crcUpdate continues CRC-16/XMODEM, the Redis Cluster key hash, over s
// (table-driven, so the test itself stays fast).
func crcUpdate(crc uint16, s string) uint16 {
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// unsafeCodec is a codec that fails on purpose, to check that codec errors
// come back wrapped and that nothing half-written is left behind.
type unsafeCodec struct{ marshal, unmarshal error }

var errCodec = errors.New("codec refuses")

func (c unsafeCodec) Marshal(v any) ([]byte, error) {
	if c.marshal != nil {
		return nil, c.marshal
	}
	return cache.JSON.Marshal(v)
}

func (c unsafeCodec) Unmarshal(b []byte, v any) error {
	if c.unmarshal != nil {
		return c.unmarshal
	}
	return cache.JSON.Unmarshal(b, v)
}

func TestValuesTheCodecRejects(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	ctx := context.Background()
	cases := []struct {
		name  string
		value any
		codec cache.Codec
		want  string // in the error
	}{
		{"chan", make(chan int), cache.JSON, "unsupported type: chan int"},
		{"func", func() {}, cache.JSON, "unsupported type: func()"},
		{"NaN", math.NaN(), cache.JSON, "unsupported value: NaN"},
		{"cycle", cyclic(), cache.JSON, "encountered a cycle"},
		{"codec-error", "fine", unsafeCodec{marshal: errCodec}, errCodec.Error()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := redistest.Prefix(t, direct)
			// The loaded value is the caller's, returned uncached; the
			// encode error goes to the hook.
			var hooked error
			c := cache.New[any](direct, cache.WithPrefix(p), cache.WithCodec(tc.codec),
				cache.WithErrorHook(func(_ string, err error) { hooked = err }))
			_, err := c.GetOrLoad(ctx, "k", func(context.Context) (any, error) { return tc.value, nil })
			if err != nil {
				t.Errorf("GetOrLoad = %v; want the loaded value, uncached", err)
			}
			if hooked == nil || !strings.Contains(hooked.Error(), "cache: encode value") || !strings.Contains(hooked.Error(), tc.want) {
				t.Errorf("error hook got %v; want an encode error containing %q", hooked, tc.want)
			}
			if tc.codec != cache.JSON && !errors.Is(hooked, errCodec) {
				t.Errorf("errors.Is(%v, errCodec) = false; want the codec's error wrapped", hooked)
			}
			if n := c.Stats().EncodeErrors; n != 1 {
				t.Errorf("Stats().EncodeErrors = %d; want 1", n)
			}
			if n := direct.Exists(ctx, p+"k", lockKeyOf(p+"k")).Val(); n != 0 {
				t.Errorf("EXISTS value, lock = %d; want 0: nothing cached, lock released", n)
			}
		})
	}
	// A codec that writes but cannot read back: never a wrong value. Every
	// caller decodes what the cache stored, so every call gets the codec's
	// decode error. The first call misses and loads, the second finds a
	// record it cannot decode and loads again; from there the key is in
	// quarantine (100 ms, doubling), so the third loads only if the machine
	// took longer than that (the intervals are tested in cache).
	t.Run("unreadable", func(t *testing.T) {
		p := redistest.Prefix(t, direct)
		c := cache.New[string](direct, cache.WithPrefix(p), cache.WithCodec(unsafeCodec{unmarshal: errCodec}))
		src := newSource(0)
		for i := range 3 {
			v, err := c.GetOrLoad(ctx, "k", src.loader("k", "v"))
			if !errors.Is(err, errCodec) || !strings.Contains(fmt.Sprint(err), "cache: decode value") || v != "" {
				t.Errorf("call %d: GetOrLoad = %q, %v; want the codec's decode error", i, v, err)
			}
		}
		if n := src.loads("k"); n < 2 || n > 3 {
			t.Errorf("loads = %d; want 2 (3 past the quarantine's first interval): an unreadable record is a miss", n)
		}
		t.Logf("figures: codec that cannot decode: %d loads for 3 sequential calls", src.loads("k"))
	})
}

func cyclic() any {
	m := map[string]any{}
	m["self"] = m
	return m
}

// TestForeignDataAtKey puts data that another program wrote at the cache's
// key. The cache cannot read it, so it counts as a miss: the loader runs once
// and the record replaces the foreign data (the key belongs to the cache).
func TestForeignDataAtKey(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	ctx := context.Background()
	cases := []struct {
		name  string
		write func(rdb *redis.Client, key string)
	}{
		{"plain-string", func(r *redis.Client, k string) { r.Set(ctx, k, "hello from php", 0) }},
		{"json-no-header", func(r *redis.Client, k string) { r.Set(ctx, k, `"v"`, 0) }},
		{"hash-WRONGTYPE", func(r *redis.Client, k string) { r.HSet(ctx, k, "f", "v") }},
		{"list-WRONGTYPE", func(r *redis.Client, k string) { r.RPush(ctx, k, "a", "b") }},
		{"empty", func(r *redis.Client, k string) { r.Set(ctx, k, "", 0) }},
		{"truncated-header", func(r *redis.Client, k string) { r.Set(ctx, k, "\x01\x00", 0) }},
		{"future-version", func(r *redis.Client, k string) { r.Set(ctx, k, "\x02\x00\x00\"v\"", 0) }},
		{"unknown-required-flag", func(r *redis.Client, k string) { r.Set(ctx, k, "\x01\x02\x00\"old\"", 0) }},
		{"metadata-past-end", func(r *redis.Client, k string) { r.Set(ctx, k, "\x01\x10\x09\"old\"", 0) }},
		{"notfound-with-payload", func(r *redis.Client, k string) { r.Set(ctx, k, "\x01\x01\x00\"old\"", 0) }},
		{"truncated-json", func(r *redis.Client, k string) { r.Set(ctx, k, "\x01\x00\x00\"ol", 0) }},
		{"wrong-json-type", func(r *redis.Client, k string) { r.Set(ctx, k, "\x01\x00\x00{\"a\":1}", 0) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := redistest.Prefix(t, direct)
			cs := procs(t, 2, addr, nil, cache.WithPrefix(p), cache.WithRetry(100, 20*time.Millisecond))
			tc.write(direct, p+"k")
			src := newSource(20 * time.Millisecond)
			out := stampede(t, cs, 5, "k", "v", src.loader("k", "v"))
			if out.ok != 10 || src.loads("k") != 1 {
				t.Errorf("callers: %v, loads=%d; want 10 ok, 1 load", out, src.loads("k"))
			}
			if got := stored(t, direct, p+"k"); got != `"v"` {
				t.Errorf("stored = %s; want our record", got)
			}
		})
	}
	// A valid not-found record is ours: ErrNotFound without a load.
	t.Run("notfound-record", func(t *testing.T) {
		p := redistest.Prefix(t, direct)
		direct.Set(ctx, p+"k", "\x01\x01\x00", time.Minute)
		c := cache.New[string](direct, cache.WithPrefix(p))
		_, err := c.GetOrLoad(ctx, "k", func(context.Context) (string, error) { t.Error("loader called"); return "", nil })
		if !errors.Is(err, cache.ErrNotFound) {
			t.Errorf("GetOrLoad = %v; want ErrNotFound", err)
		}
	})
}

func TestHugeValue(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	key := redistest.Prefix(t, direct) + "k"
	huge := strings.Repeat("0123456789abcdef", 8<<20/16) // 8 MiB
	cs := procs(t, 2, addr, nil, cache.WithRetry(300, 20*time.Millisecond))
	src := newSource(50 * time.Millisecond)
	start := time.Now()
	out := stampede(t, cs, 5, key, huge, src.loader(key, huge))
	if out.ok != 10 || src.loads(key) != 1 {
		t.Errorf("callers: %v, loads=%d; want 10 ok, 1 load", out, src.loads(key))
	}
	if got := stored(t, direct, key); got != `"`+huge+`"` { // whole, after the header and its metadata
		t.Errorf("stored %d bytes; want %d, the JSON of the value", len(got), len(huge)+2)
	}
	t.Logf("figures: 8MiB value, 2 procs x 5 callers: loads=%d %v in %v", src.loads(key), out, time.Since(start).Round(time.Millisecond))
}

func TestInvalidOptionsPanic(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	cases := []struct {
		name string
		opt  cache.Option
		want string
	}{
		{"ttl-zero", cache.WithTTL(0), "WithTTL"},
		{"ttl-negative", cache.WithTTL(-time.Second), "WithTTL"},
		{"ttl-sub-ms", cache.WithTTL(time.Microsecond), "WithTTL"},
		{"notfound-negative", cache.WithNotFoundTTL(-1), "WithNotFoundTTL"},
		{"notfound-sub-ms", cache.WithNotFoundTTL(time.Nanosecond), "WithNotFoundTTL"},
		{"lockttl-zero", cache.WithLockTTL(0), "WithLockTTL"},
		{"lockttl-negative", cache.WithLockTTL(-time.Second), "WithLockTTL"},
		{"retry-negative", cache.WithRetry(-1, time.Second), "WithRetry"},
		{"retry-zero-backoff", cache.WithRetry(3, 0), "WithRetry"},
		{"retry-negative-backoff", cache.WithRetry(3, -time.Second), "WithRetry"},
		{"jitter-negative", cache.WithJitter(-0.1), "WithJitter"},
		{"jitter-one", cache.WithJitter(1), "WithJitter"},
		{"loadtimeout-zero", cache.WithLoadTimeout(0), "WithLoadTimeout"},
		{"loadtimeout-negative", cache.WithLoadTimeout(-1), "WithLoadTimeout"},
		{"codec-nil", cache.WithCodec(nil), "WithCodec"},
		{"policy-unknown", cache.WithFailurePolicy(7), "WithFailurePolicy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msg := panicMessage(func() { cache.New[string](rdb, tc.opt) })
			if !strings.HasPrefix(msg, "cache: "+tc.want) {
				t.Errorf("New(%s) panicked with %q; want a message starting %q", tc.name, msg, "cache: "+tc.want)
			}
		})
	}
	t.Run("nil-client", func(t *testing.T) {
		if msg := panicMessage(func() { cache.New[string](nil) }); !strings.HasPrefix(msg, "cache: New: nil Redis client") {
			t.Errorf("New(nil) panicked with %q", msg)
		}
	})
	// Valid edge values must not panic.
	for _, opt := range []cache.Option{cache.WithNotFoundTTL(0), cache.WithRetry(0, 0), cache.WithLockTTL(3 * time.Millisecond),
		cache.WithTTL(time.Millisecond), cache.WithoutJitter(), cache.WithJitter(0.999)} {
		if msg := panicMessage(func() { cache.New[string](rdb, opt) }); msg != "" {
			t.Errorf("valid option panicked: %q", msg)
		}
	}
}

// TestNilOptionPanicsClearly guards a fixed bug: New(rdb, nil), e.g. an
// option variable left unset, died with a nil-func runtime error instead of a
// "cache:" message.
func TestNilOptionPanicsClearly(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	if msg := panicMessage(func() { cache.New[string](rdb, nil) }); !strings.HasPrefix(msg, "cache: ") {
		t.Errorf("New(rdb, nil) panicked with %q; want a cache: message", msg)
	}
}

// TestHugeTTLWithJitter guards a fixed bug: jitter multiplied the TTL as a
// float, and above about 265 years the product overflowed int64, so the value
// was stored for 1ms.
func TestHugeTTLWithJitter(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	p := redistest.Prefix(t, direct)
	c := cache.New[string](direct, cache.WithPrefix(p), cache.WithTTL(math.MaxInt64))
	ctx := context.Background()
	for i := range 10 {
		k := fmt.Sprint(i)
		if _, err := c.GetOrLoad(ctx, k, func(context.Context) (string, error) { return "v", nil }); err != nil {
			t.Fatal(err)
		}
		if ttl := direct.PTTL(ctx, p+k).Val(); ttl < time.Hour {
			t.Errorf("key %s: PTTL = %v with WithTTL(MaxInt64); want far more than an hour", k, ttl)
		}
	}
}

// TestNaNJitterRejected guards a fixed bug: WithJitter(NaN) passed
// validation (NaN < 0 and NaN >= 1 are both false) and made every TTL 1ms.
func TestNaNJitterRejected(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	if msg := panicMessage(func() { cache.New[string](rdb, cache.WithJitter(math.NaN())) }); !strings.HasPrefix(msg, "cache: WithJitter") {
		t.Errorf("New(WithJitter(NaN)) panicked with %q; want a cache: WithJitter message", msg)
	}
}

func panicMessage(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	f()
	return ""
}
