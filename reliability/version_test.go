// The versioned Set, across OS processes and on a cluster: of two writers
// that updated the source and then call Set in the opposite order, the older
// write is refused and every process, near caches included, keeps the newer
// value.
package reliability_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/proctest"
	"github.com/stampede-go/stampede/internal/redistest"
)

func init() { childModes["versioned-writer"] = runVersionedWriterChild }

// runVersionedWriterChild serves orders from stdin, one a line, on a Cache
// of PREFIX with a near cache unless NEAR is "off":
//
//	set KEY VALUE VERSION: a versioned Set; prints "set ok", "set refused"
//	                       or "set error ...".
//	get KEY:               prints "got VALUE" or "got error ...".
func runVersionedWriterChild(env func(string) string) int {
	rdb := redis.NewClient(&redis.Options{Addr: env("REDIS")})
	defer rdb.Close()
	opts := []cache.Option{cache.WithPrefix(env("PREFIX"))}
	if env("NEAR") == "off" {
		opts = append(opts, cache.WithoutNearCache())
	}
	c := cache.New[string](rdb, opts...)
	defer c.Close()
	ctx := context.Background()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 4 && f[0] == "set":
			v, _ := strconv.ParseInt(f[3], 10, 64)
			switch err := c.Set(ctx, f[1], f[2], cache.Version(v)); {
			case err == nil:
				fmt.Println("set ok")
			case errors.Is(err, cache.ErrOlderVersion):
				fmt.Println("set refused")
			default:
				fmt.Println("set error", err)
			}
		case len(f) == 2 && f[0] == "get":
			v, err := c.Get(ctx, f[1])
			if err != nil {
				fmt.Println("got error", err)
				continue
			}
			fmt.Println("got", v)
		default:
			return 2
		}
	}
	return 0
}

// TestVersionedSetAcrossProcesses: two writer processes, each with or
// without a near cache, write every key in the forced order (the newer
// write's Set first); the older Set is refused every time, and both
// processes read the newer value at once.
func TestVersionedSetAcrossProcesses(t *testing.T) {
	t.Parallel()
	for _, near := range []string{"on", "off"} {
		t.Run("near="+near, func(t *testing.T) {
			t.Parallel()
			addr := redistest.Addr(t)
			p := redistest.Prefix(t, newClient(t, addr, nil))
			env := map[string]string{"REDIS": addr, "PREFIX": p, "NEAR": near}
			older, newer := proctest.Start(t, "versioned-writer", env), proctest.Start(t, "versioned-writer", env)
			const within = 30 * time.Second
			for _, w := range []*proctest.Child{older, newer} {
				w.Expect(t, "ready", within)
			}
			const rounds = 100
			refused := 0
			for i := range rounds {
				key := "k" + strconv.Itoa(i)
				// Both hold the key in memory first.
				older.Send(t, "set "+key+" v0 0")
				older.Expect(t, "set ok", within)
				for _, w := range []*proctest.Child{older, newer} {
					w.Send(t, "get "+key)
					if got := w.Expect(t, "got", within); got != "v0" {
						t.Fatalf("round %d: read %q; want v0", i, got)
					}
				}
				newer.Send(t, "set "+key+" v2 2")
				newer.Expect(t, "set ok", within)
				older.Send(t, "set "+key+" v1 1")
				if got := older.Expect(t, "set", within); got == "refused" {
					refused++
				} else {
					t.Errorf("round %d: the older Set, after the newer one returned: %q; want refused", i, got)
				}
				for _, w := range []*proctest.Child{older, newer} {
					w.Send(t, "get "+key)
					if got := w.Expect(t, "got", within); got != "v2" {
						t.Fatalf("round %d: a process read %q after both Sets returned; want v2", i, got)
					}
				}
			}
			t.Logf("%d forced interleavings across 2 processes (near cache %s): %d older Sets refused", rounds, near, refused)
		})
	}
}

// TestClusterVersionedSet: the forced interleaving on keys of every master
// of a 3-master cluster, with near caches.
func TestClusterVersionedSet(t *testing.T) {
	t.Parallel()
	const masters = 3
	cl := startCluster(t, masters)
	ctx := context.Background()
	p := "ver" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	keys := keysOnEveryMaster(p, masters, 3)
	older := cache.New[string](cl.client(t), cache.WithPrefix(p))
	t.Cleanup(func() { older.Close() })
	newer := cache.New[string](cl.client(t), cache.WithPrefix(p))
	t.Cleanup(func() { newer.Close() })
	for _, k := range keys {
		if err := older.Set(ctx, k, "v0", cache.Version(0)); err != nil {
			t.Fatal(err)
		}
		for _, c := range []*cache.Cache[string]{older, newer} {
			if _, err := c.Get(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		if err := newer.Set(ctx, k, "v2", cache.Version(2)); err != nil {
			t.Fatal(err)
		}
		if err := older.Set(ctx, k, "v1", cache.Version(1)); !errors.Is(err, cache.ErrOlderVersion) {
			t.Fatalf("%s: the older Set after the newer one returned = %v; want ErrOlderVersion", k, err)
		}
		for _, c := range []*cache.Cache[string]{older, newer} {
			if v, err := c.Get(ctx, k); err != nil || v != "v2" {
				t.Fatalf("%s: Get after both Sets = %q, %v; want v2", k, v, err)
			}
		}
	}
}
