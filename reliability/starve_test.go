// This file a process whose callers only ever hit memory must still
// acknowledge writes and renew its lease in time (the near cache yields
// the processor now and then), or every other process's writes wait out
// its lease although it is alive.
package reliability_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/proctest"
	"github.com/stampede-go/stampede/internal/redistest"
)

func TestBusyReadersDoNotMakeWritesWaitOutTheirLease(t *testing.T) {
	// Not parallel: it loads both cores itself, and other tests' load on
	// top made 6 of 40 writes wait in one CI-like run.
	addr := redistest.Addr(t)
	direct := newClient(t, addr, nil)
	p := redistest.Prefix(t, direct)
	var leaseWaits atomic.Int64
	w := cache.New[string](newClient(t, addr, nil), cache.WithPrefix(p), cache.WithObserver(func(e cache.Event) {
		if e.Kind == cache.EventNearLeaseWait {
			leaseWaits.Add(1)
		}
	}))
	t.Cleanup(func() { w.Close() })
	ctx := context.Background()
	const nkeys = 100
	for i := range nkeys {
		if err := w.Set(ctx, "k"+strconv.Itoa(i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	// Three processes of 64 goroutines reading those keys from memory
	// without pause: more than the cores.
	kids := make([]*proctest.Child, 3)
	for i := range kids {
		kids[i] = proctest.Start(t, "scale-holder", map[string]string{"REDIS": addr, "PREFIX": p, "NEAR": "strict", "KEYS": "k",
			"NKEYS": strconv.Itoa(nkeys), "CACHES": "1", "READERS": "64"})
	}
	for _, k := range kids {
		k.Expect(t, "ready", 60*time.Second)
	}
	time.Sleep(nearLease) // past the registry's first lease
	leaseWaits.Store(0)
	const writes = 40
	for i := range writes {
		if err := w.Set(ctx, "k"+strconv.Itoa(i%nkeys), "v"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	// A renewal late by most of a lease can cost a wait on a loaded
	// machine (0 in 10 runs alone, 6 once beside other packages' tests);
	// starved, about a third of the writes wait.
	t.Logf("%d of %d writes waited out the busy process's lease", leaseWaits.Load(), writes)
	if n := leaseWaits.Load(); n > writes/5 {
		t.Errorf("%d of %d writes waited out the lease of a live process whose callers only hit memory", n, writes)
	}
}
