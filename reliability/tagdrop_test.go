// DeleteByTag drops from the near caches of other OS processes the values
// that carry the tag, and only those: a value with another tag is still
// served from memory after it returned, while no read that began after it
// returned gets a value with the tag.
package reliability_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/proctest"
	"github.com/stampede-go/stampede/internal/redistest"
)

func init() { childModes["tag-reader"] = runTagReaderChild }

// runTagReaderChild, each round: told "go KEYT KEYU", it keeps KEYU in
// memory and reads KEYT in a loop until both are served from memory
// ("warm"); told "stop <ns>", it reports how many reads of KEYT that began
// after that time got "old", then reads KEYU once and reports whether
// memory served it: "result <reads> <old after> <KEYU from memory: 0/1>".
// Every value is loaded from sourceKey and tagged "tag:" + its key.
func runTagReaderChild(env func(string) string) int {
	rdb := redis.NewClient(&redis.Options{Addr: env("REDIS")})
	defer rdb.Close()
	p := env("PREFIX")
	var nearHits atomic.Int64
	c := cache.New[string](rdb, cache.WithPrefix(p), cache.WithTags(), cache.WithNearCache(1<<20), cache.WithNearMaxAge(time.Minute),
		cache.WithObserver(func(e cache.Event) {
			if e.Kind == cache.EventNearHit {
				nearHits.Add(1)
			}
		}))
	defer c.Close()
	load := func(key string) func(context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			cache.AddTags(ctx, "tag:"+key)
			return rdb.Get(ctx, sourceKey(p, key)).Result()
		}
	}
	ctx := context.Background()
	rounds, _ := strconv.Atoi(env("ROUNDS"))
	in := bufio.NewScanner(os.Stdin)
	for range rounds {
		fmt.Println("ready")
		if !in.Scan() {
			return 2
		}
		f := strings.Fields(in.Text())
		if len(f) != 3 {
			return 2
		}
		keyT, keyU := f[1], f[2]
		for { // KEYU in memory
			hits := nearHits.Load()
			if _, err := c.GetOrLoad(ctx, keyU, load(keyU)); err == nil && nearHits.Load() > hits {
				break
			}
			time.Sleep(time.Millisecond)
		}
		r, ok := readUntilStopped(in, &nearHits, func() (string, error) { return c.GetOrLoad(ctx, keyT, load(keyT)) })
		if !ok {
			return 2
		}
		hits := nearHits.Load()
		_, err := c.GetOrLoad(ctx, keyU, load(keyU))
		kept := 0
		if err == nil && nearHits.Load() == hits+1 {
			kept = 1
		}
		fmt.Println("result", r.reads, r.after, kept)
	}
	return 0
}

// TestDeleteByTagKeepsOtherTagsAcrossProcesses: three reader processes
// serve a value tagged T and one tagged U from memory; another process
// changes T's source and calls DeleteByTag(T). No read of T's value that
// began after it returned gets the old value, and every reader still
// serves U's value from memory.
func TestDeleteByTagKeepsOtherTagsAcrossProcesses(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	p := redistest.Prefix(t, direct)
	writer := cache.New[string](newClient(t, addr, nil), cache.WithPrefix(p), cache.WithTags(), cache.WithNearCache(1<<20))
	t.Cleanup(func() { writer.Close() })
	const readers, rounds = 3, 3
	kids := make([]*proctest.Child, readers)
	for i := range kids {
		kids[i] = proctest.Start(t, "tag-reader", map[string]string{"REDIS": addr, "PREFIX": p, "ROUNDS": strconv.Itoa(rounds)})
	}
	ctx := context.Background()
	source := func(key, v string) {
		if err := direct.Set(ctx, sourceKey(p, key), v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var reads, old, kept int64
	for r := range rounds {
		keyT, keyU := "t"+strconv.Itoa(r), "u"+strconv.Itoa(r)
		source(keyT, "old")
		source(keyU, "u")
		for _, k := range kids {
			k.Expect(t, "ready", 10*time.Second)
			k.Send(t, "go "+keyT+" "+keyU)
		}
		for _, k := range kids {
			k.Expect(t, "warm", 20*time.Second)
		}
		source(keyT, "new")
		if err := writer.DeleteByTag(ctx, "tag:"+keyT); err != nil {
			t.Fatal(err)
		}
		done := time.Now().UnixNano()
		time.Sleep(300 * time.Millisecond) // every reader has read again since
		for _, k := range kids {
			k.Send(t, "stop "+strconv.FormatInt(done, 10))
		}
		for i, k := range kids {
			f := strings.Fields(k.Expect(t, "result", 10*time.Second))
			n, _ := strconv.ParseInt(f[0], 10, 64)
			o, _ := strconv.ParseInt(f[1], 10, 64)
			reads, old = reads+n, old+o
			if f[2] == "1" {
				kept++
			} else {
				t.Errorf("round %d, reader %d: the value tagged U was not served from memory after DeleteByTag(T)", r, i)
			}
		}
	}
	t.Logf("%d reads of T's value in %d process-rounds, %d old after DeleteByTag(T) returned; U's value kept in memory in %d", reads, readers*rounds, old, kept)
	if old > 0 {
		t.Errorf("%d reads began after DeleteByTag(T) returned and got the value it removed", old)
	}
}
