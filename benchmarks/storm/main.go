// Command storm is a write storm: two OS processes, each with the
// default near cache on its own client, Set 10 shared keys from 8
// goroutines, 2,000 Sets each, reading each key back, then Close while the
// other may still be writing. It prints each process's Set p50, p99 and
// max, and its lease waits (writes that waited out another process's lease
// instead of hearing its acknowledgement): 0 is the target while every
// process is alive, a closing one included.
//
//	cd benchmarks && go build -o /tmp/storm ./storm && for i in 1 2 3; do /tmp/storm; done
//
// It uses the Redis at REDIS_ADDR (default 127.0.0.1:6379) under a prefix
// of its own.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
)

const (
	procs      = 2
	setsEach   = 2000
	goroutines = 8
	keys       = 10
)

func main() {
	if len(os.Args) > 2 && os.Args[1] == "child" {
		if err := child(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	prefix := fmt.Sprintf("storm:%d:", time.Now().UnixNano())
	var cmds []*exec.Cmd
	for range procs {
		c := exec.Command(os.Args[0], "child", prefix)
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		cmds = append(cmds, c)
	}
	failed := false
	for _, c := range cmds {
		failed = c.Wait() != nil || failed
	}
	if failed {
		os.Exit(1)
	}
}

func addr() string {
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

func child(prefix string) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr()})
	defer rdb.Close()
	var waits atomic.Int64
	c := cache.New[string](rdb, cache.WithPrefix(prefix), cache.WithObserver(func(e cache.Event) {
		if e.Kind == cache.EventNearLeaseWait {
			waits.Add(1)
		}
	}))
	ctx := context.Background()
	load := func(context.Context) (string, error) { return "x", nil }
	for i := range keys {
		if _, err := c.GetOrLoad(ctx, strconv.Itoa(i), load); err != nil {
			return err
		}
	}
	time.Sleep(1500 * time.Millisecond) // past the registry's first lease, which every write would wait out
	var (
		mu   sync.Mutex
		lat  []time.Duration
		errs atomic.Int64
		wg   sync.WaitGroup
	)
	start := time.Now()
	for g := range goroutines {
		wg.Go(func() {
			for i := range setsEach / goroutines {
				k := strconv.Itoa((g + i) % keys)
				t0 := time.Now()
				if err := c.Set(ctx, k, "v"); err != nil {
					errs.Add(1)
				}
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
				_, _ = c.GetOrLoad(ctx, k, load)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	c.Close()
	slices.Sort(lat)
	q := func(f float64) time.Duration { return lat[int(f*float64(len(lat)-1))] }
	fmt.Printf("pid %d: %d Sets in %v, p50 %v, p99 %v, max %v, lease waits %d, errors %d\n",
		os.Getpid(), len(lat), elapsed.Round(time.Millisecond), q(0.5), q(0.99), lat[len(lat)-1], waits.Load(), errs.Load())
	return nil
}
