// This file proves that GetOrLoadMany stays off go-redis's
// ClusterClient.Pipelined while a slot migrates: that
// pipeline races with itself when one node's part meets TRYAGAIN on one
// command and ASK on another. TestGoRedisPipelineRaceDuringMigration is the
// go-redis-only reproduction (run it with -race and
// STAMPEDE_GOREDIS_REPRO=1; RELIABILITY.md has it for upstream).
package reliability_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stampede-go/stampede/cache"
)

// migrating starts a 3-master cluster and sets the slot of a new tag
// MIGRATING from its master to the next one (IMPORTING there), after
// setting each of seed's keys (suffixes of the tag) on the source. It
// returns the cluster, the tag, and the slot's source and target masters.
func migrating(t *testing.T, seed map[string]string) (cl *cluster, tag string, from, to int) {
	t.Helper()
	const masters = 3
	cl = startCluster(t, masters)
	ctx := context.Background()
	tag = "{pm" + strconv.FormatInt(time.Now().UnixNano(), 36) + "}"
	s := slot(tag)
	from = cl.owner(s, masters)
	to = (from + 1) % masters
	for k, v := range seed {
		if err := cl.rdbs[from].Set(ctx, tag+k, v, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range [][]any{
		{to, "CLUSTER", "SETSLOT", s, "IMPORTING", cl.ids[from]},
		{from, "CLUSTER", "SETSLOT", s, "MIGRATING", cl.ids[to]},
	} {
		if err := cl.rdbs[c[0].(int)].Do(ctx, c[1:]...).Err(); err != nil {
			t.Fatalf("%v: %v", c[1:], err)
		}
	}
	return cl, tag, from, to
}

func TestGoRedisPipelineRaceDuringMigration(t *testing.T) {
	t.Parallel()
	if os.Getenv("STAMPEDE_GOREDIS_REPRO") == "" {
		t.Skip("go-redis's own race: set STAMPEDE_GOREDIS_REPRO=1 and run with -race to reproduce it")
	}
	cl, tag, _, _ := migrating(t, map[string]string{":present": "v"})
	present := tag + ":present"
	rdb := cl.client(t)
	ctx := context.Background()
	// On the source: the EVAL names a present and a missing key of the
	// migrating slot (TRYAGAIN), the GET a missing key (ASK).
	for i := range 50 {
		var eval *redis.Cmd
		var get *redis.StringCmd
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			eval = p.Eval(ctx, "return redis.call('EXISTS', KEYS[1], KEYS[2])", []string{present, tag + ":absent"})
			get = p.Get(ctx, tag+":missing")
			return nil
		})
		t.Logf("round %d: pipeline %v; EVAL %v; GET %v", i, err, eval.Err(), get.Err())
	}
}

func TestGetOrLoadManyDuringSlotMigration(t *testing.T) {
	t.Parallel()
	// Batches whose keys are all in a slot half moved: on the source, some
	// keys hold an unreadable value (the read-or-lock meets TRYAGAIN: the
	// value is there, the lock is not), the others are absent (ASK). Through
	// ClusterClient.Pipelined that mix made go-redis race with itself (the
	// race detector fired in 6 of 9 runs); here it must stay silent while
	// every key is loaded once and every caller answered.
	const rounds, perKind, instances = 6, 4, 2
	seed := map[string]string{}
	for r := range rounds {
		for i := range perKind {
			seed[":r"+strconv.Itoa(r)+":bad"+strconv.Itoa(i)] = "\x63not a record"
		}
	}
	cl, tag, from, to := migrating(t, seed)
	ctx := context.Background()
	cs := make([]*cache.Cache[string], instances)
	for i := range cs {
		cs[i] = cache.New[string](cl.client(t), cache.WithRetry(500, 20*time.Millisecond))
		t.Cleanup(func() { _ = cs[i].Close() })
	}
	src := &batchSource{delay: 50 * time.Millisecond}
	var (
		wg              sync.WaitGroup
		mu              sync.Mutex
		answered, wrong int
		errs            []error
		all             []string
	)
	for r := range rounds {
		var keys []string
		for i := range perKind {
			r, i := strconv.Itoa(r), strconv.Itoa(i)
			keys = append(keys, tag+":r"+r+":bad"+i, tag+":r"+r+":cold"+i)
		}
		all = append(all, keys...)
		for _, c := range cs {
			wg.Go(func() {
				got, err := c.GetOrLoadMany(ctx, keys, src.loadMany)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				}
				for _, k := range keys {
					if got[k] == "v:"+k {
						answered++
					} else {
						wrong++
					}
				}
			})
		}
	}
	time.Sleep(time.Second) // the batches meet the half-moved slot
	s := slot(tag)
	for {
		ks, err := cl.rdbs[from].ClusterGetKeysInSlot(ctx, int(s), 100).Result()
		if err != nil {
			t.Fatalf("GETKEYSINSLOT: %v", err)
		}
		if len(ks) == 0 {
			break
		}
		args := []any{"MIGRATE", "127.0.0.1", cl.nodes[to].Port, "", 0, 5000, "REPLACE", "KEYS"}
		for _, k := range ks {
			args = append(args, k)
		}
		if err := cl.rdbs[from].Do(ctx, args...).Err(); err != nil {
			t.Fatalf("MIGRATE: %v", err)
		}
	}
	for _, node := range []int{to, from, 3 - from - to} {
		if err := cl.rdbs[node].Do(ctx, "CLUSTER", "SETSLOT", s, "NODE", cl.ids[to]).Err(); err != nil {
			t.Fatalf("SETSLOT NODE: %v", err)
		}
	}
	wg.Wait()

	_, perKey := src.snapshot()
	extra := 0
	for _, k := range all {
		if perKey[k] != 1 {
			extra += perKey[k] - 1
			t.Errorf("loads(%q) = %d; want 1", k, perKey[k])
		}
	}
	for _, err := range errs {
		t.Errorf("GetOrLoadMany: %v", err)
	}
	if want := rounds * instances * 2 * perKind; answered != want {
		t.Errorf("%d of %d keys answered (%d wrong or missing)", answered, want, wrong)
	}
	t.Logf("figures: %d batches of %d keys (half unreadable: TRYAGAIN, half absent: ASK) during a slot migration: %d keys answered, %d wrong, %d errors, %d extra loads",
		rounds*instances, 2*perKind, answered, wrong, len(errs), extra)
}

// singles counts the commands a node runs outside pipelines, by name, and
// the GETs its pipelines send after ASKING (go-redis itself only sends
// ASKING before single commands: a GET that follows one is the batch's).
type singles struct {
	mu sync.Mutex // protects n
	n  map[string]int
}

func (h *singles) get(name string) int { h.mu.Lock(); defer h.mu.Unlock(); return h.n[name] }

func (h *singles) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *singles) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.n[cmd.Name()]++
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (h *singles) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		for i := 1; i < len(cmds); i++ {
			if cmds[i-1].Name() == "asking" && cmds[i].Name() == "get" {
				h.n["asking get"]++
			}
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func TestGetOrLoadManyFollowsRedirects(t *testing.T) {
	t.Parallel()
	// The batch's pipelines meet MOVED (a client whose slot map went stale
	// after a slot moved) or ASK (keys absent from a slot's source while it
	// migrates) and follow them themselves. After MOVED every script runs
	// in the batch's pipelines, none is left to a single-key GetOrLoad.
	// After ASK, the batch sends ASKING and the command to the importing
	// node: the GETs get nil, the scripts (two keys, both missing there)
	// TRYAGAIN, waited out until the slot has moved.
	t.Run("MOVED", func(t *testing.T) { t.Parallel(); followsRedirects(t, true) }) // a cluster each
	t.Run("ASK", func(t *testing.T) { t.Parallel(); followsRedirects(t, false) })
}

func followsRedirects(t *testing.T, moved bool) {
	cl, tag, from, to := migrating(t, nil)
	ctx := context.Background()
	addrs := make([]string, len(cl.nodes))
	for i, n := range cl.nodes {
		addrs[i] = n.Addr
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = rdb.Close() })
	h := &singles{n: map[string]int{}}
	rdb.OnNewNode(func(node *redis.Client) { node.AddHook(h) })
	if err := rdb.Ping(ctx).Err(); err != nil { // the slot map, with the slot still on from
		t.Fatal(err)
	}
	s := slot(tag)
	finish := func() {
		for _, node := range []int{to, from, 3 - from - to} {
			if err := cl.rdbs[node].Do(ctx, "CLUSTER", "SETSLOT", s, "NODE", cl.ids[to]).Err(); err != nil {
				t.Errorf("SETSLOT NODE: %v", err)
			}
		}
	}
	if moved {
		finish()
	} else {
		time.AfterFunc(500*time.Millisecond, finish) // the batch waits out TRYAGAIN until then
	}
	c := cache.New[string](rdb, cache.WithFailurePolicy(cache.FailClosed), cache.WithRetry(100, 20*time.Millisecond), cache.WithoutNearCache()) // it counts scripts sent one by one
	t.Cleanup(func() { _ = c.Close() })
	keys := make([]string, 6)
	for i := range keys {
		keys[i] = tag + ":k" + strconv.Itoa(i)
	}
	src := &batchSource{}
	got, err := c.GetOrLoadMany(ctx, keys, src.loadMany)
	if err != nil {
		t.Fatalf("GetOrLoadMany: %v", err)
	}
	calls, _ := src.snapshot()
	for _, k := range keys {
		if got[k] != "v:"+k {
			t.Errorf("[%q] = %q; want %q", k, got[k], "v:"+k)
		}
	}
	if moved && len(calls) != 1 {
		t.Errorf("loadMany calls = %d; want 1 (the batch's own)", len(calls))
	}
	if n := h.get("evalsha") + h.get("eval"); moved && n != 0 {
		t.Errorf("%d scripts sent one by one; want 0: the batch follows MOVED", n)
	}
	if n := h.get("asking get"); !moved && n != len(keys) {
		t.Errorf("%d GETs sent after ASKING; want %d, one per key: the batch follows ASK", n, len(keys))
	}
	t.Logf("figures: %d keys (MOVED: %v): loadMany calls=%d, single scripts=%d, GETs after ASKING=%d",
		len(keys), moved, len(calls), h.get("evalsha")+h.get("eval"), h.get("asking get"))
}
