// This file proves on a real cluster that batched reads keep one
// slot's error to that slot's readers: a slot moved behind the client's
// back answers its MGET with MOVED; its readers go on through the
// read-or-lock script, and no other key's reader sees an error.
package reliability_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stampede-go/stampede/cache"
)

func TestClusterBatchedReadsKeepASlotsErrorToItsReaders(t *testing.T) {
	t.Parallel()
	const masters = 2
	cl := startCluster(t, masters)
	ctx := context.Background()
	writer := cache.New[string](cl.client(t))
	var mu sync.Mutex
	errsByKey := map[string][]string{}
	// No near cache: its tracking hub reloads the client's slot map every
	// second, and one reload between the move and the reads left nothing
	// to meet MOVED.
	reader := cache.New[string](cl.client(t), cache.WithoutNearCache(), cache.WithObserver(func(e cache.Event) {
		if e.Kind == cache.EventRedisError {
			mu.Lock()
			errsByKey[e.Key] = append(errsByKey[e.Key], e.Err.Error())
			mu.Unlock()
		}
	}))
	keys := make([]string, 200)
	for i := range keys {
		keys[i] = "co:k" + strconv.Itoa(i)
		if i < 10 {
			keys[i] = "{co}:k" + strconv.Itoa(i) // ten keys in the slot that moves: some are batched
		}
		if err := writer.Set(ctx, keys[i], "v"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	// The reader learns the slot map, then keys[0]'s slot moves to the other
	// master without it knowing.
	if _, err := reader.Get(ctx, keys[0]); err != nil {
		t.Fatal(err)
	}
	s := slot(keys[0])
	from := cl.owner(s, masters)
	to := 1 - from
	do := func(node int, args ...any) {
		t.Helper()
		if err := cl.rdbs[node].Do(ctx, args...).Err(); err != nil {
			t.Fatalf("node %d: %v: %v", node, args, err)
		}
	}
	do(to, "CLUSTER", "SETSLOT", s, "IMPORTING", cl.ids[from])
	do(from, "CLUSTER", "SETSLOT", s, "MIGRATING", cl.ids[to])
	moved := map[string]bool{}
	args := []any{"MIGRATE", "127.0.0.1", cl.nodes[to].Port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		if slot(k) == s {
			moved[k] = true
			args = append(args, k)
		}
	}
	do(from, args...)
	do(to, "CLUSTER", "SETSLOT", s, "NODE", cl.ids[to])
	do(from, "CLUSTER", "SETSLOT", s, "NODE", cl.ids[to])

	var wrong atomic.Int64
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() {
			v, err := reader.GetOrLoad(ctx, k, func(context.Context) (string, error) { return "loaded", nil })
			if err != nil || v != "v"+strconv.Itoa(i) {
				wrong.Add(1)
				t.Logf("GetOrLoad(%q) = %q, %v", k, v, err)
			}
		})
	}
	wg.Wait()
	if wrong.Load() != 0 {
		t.Errorf("%d of %d readers got an error or a wrong value; want 0", wrong.Load(), len(keys))
	}
	sawMoved := 0
	for k, errs := range errsByKey {
		if !moved[k] {
			t.Errorf("%q, not in the moved slot, saw Redis errors: %v", k, errs)
			continue
		}
		for _, e := range errs {
			if strings.HasPrefix(e, "MOVED") {
				sawMoved++
			}
		}
	}
	if sawMoved == 0 {
		t.Errorf("no reader of the moved slot met MOVED (errors: %v): the test proves nothing", errsByKey)
	}
}
