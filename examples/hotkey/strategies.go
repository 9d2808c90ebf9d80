// This file is the four ways a service instance reads the hot product
// (naive cache-aside, per-instance singleflight, this library, this library
// with its near cache) and the request loop that hammers it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"golang.org/x/sync/singleflight"
)

var strategies = []string{"naive", "local", "stampede", "stampede-near"}

// nearBudget is stampede-near's near cache: far more than the hot key needs.
const nearBudget = 64 << 20

// instanceSpec is what one service instance needs; it crosses the process
// boundary as JSON for -procs.
type instanceSpec struct {
	Strategy   string        `json:"strategy"`
	RedisAddr  string        `json:"redis_addr"`
	MongoURI   string        `json:"mongo_uri"`
	DB         string        `json:"db"`
	Key        string        `json:"key"`
	Prefix     string        `json:"prefix"` // the start of Key that is stampede-near's cache prefix
	Goroutines int           `json:"goroutines"`
	TTL        time.Duration `json:"ttl"`
	LoadDelay  time.Duration `json:"load_delay"`
}

// counters are the live totals for the progress line and for deciding when
// the traffic may stop, shared by all the instances in this process (and, in
// the parent of -procs children, fed by their progress messages).
type counters struct {
	requests, loads atomic.Int64

	mu    sync.Mutex // protects spans
	spans []span     // every database load so far
}

// addSpans records database loads.
func (c *counters) addSpans(s ...span) {
	c.mu.Lock()
	c.spans = append(c.spans, s...)
	c.mu.Unlock()
}

// spansFrom returns the loads recorded after the first i.
func (c *counters) spansFrom(i int) []span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.spans[min(i, len(c.spans)):])
}

// expiries counts the times the hot key was missing so far (see [expiries]).
func (c *counters) expiries(ttl time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, _ := expiries(c.spans, ttl)
	return n
}

// instance is one service instance: its own Redis client, MongoDB client and
// cache, as separate deployments would have.
type instance struct {
	spec instanceSpec
	rdb  *redis.Client
	mdb  *mongo.Client
	coll *mongo.Collection
	get  func(context.Context) (Product, error)
	live *counters

	closeCache func() error // the stampede strategies' Cache.Close; nil for the others

	sent     atomic.Int64 // Redis commands this instance sent (hook)
	nearHits atomic.Int64 // stampede-near's requests served from memory (observer)
	mu       sync.Mutex   // protects loads
	loads    []span
}

func newInstance(ctx context.Context, spec instanceSpec, live *counters) (*instance, error) {
	in := &instance{spec: spec, live: live}
	// DisableIdentity: no CLIENT SETINFO on each new connection, which would
	// only add noise to the command counts.
	in.rdb = redis.NewClient(&redis.Options{Addr: spec.RedisAddr, DisableIdentity: true})
	in.rdb.AddHook(countHook{&in.sent})
	mdb, err := mongo.Connect(ctx, options.Client().ApplyURI(spec.MongoURI))
	if err != nil {
		_ = in.rdb.Close()
		return nil, err
	}
	in.mdb, in.coll = mdb, mdb.Database(spec.DB).Collection("products")
	if err := errors.Join(in.rdb.Ping(ctx).Err(), mdb.Ping(ctx, nil)); err != nil {
		in.close()
		return nil, err
	}
	in.sent.Store(0) // the ping is not workload

	switch spec.Strategy {
	case "naive":
		in.get = in.naive
	case "local":
		// What go-redis/cache's Once does: singleflight around the whole
		// cache-aside path, merging callers inside this instance only.
		var g singleflight.Group
		in.get = func(ctx context.Context) (Product, error) {
			v, err, _ := g.Do(spec.Key, func() (any, error) { return in.naive(ctx) })
			p, _ := v.(Product)
			return p, err
		}
	case "stampede":
		// No jitter: every strategy gets the same TTL, so their expiries line
		// up. No early refresh: the demo compares what each strategy does when
		// the hot key expires, and early refresh (on by default) reloads a hot
		// key before it expires, so that it never does. No near cache: this
		// row is the Redis path (stampede-near is the default's).
		c := cache.New[Product](in.rdb, append([]cache.Option{
			cache.WithTTL(spec.TTL), cache.WithoutJitter(), cache.WithEarlyRefresh(0), cache.WithoutNearCache(),
		}, cacheOptions[spec.Strategy]...)...)
		in.get = func(ctx context.Context) (Product, error) { return c.GetOrLoad(ctx, spec.Key, in.load) }
		in.closeCache = c.Close
	case "stampede-near":
		// stampede, plus a near cache: hits are memory reads, kept coherent
		// by Redis client-side caching. The prefix makes Redis report only
		// the demo's keys. Shared values are safe here: a Product holds no
		// map, slice or pointer, so each caller gets its own copy anyway.
		c := cache.New[Product](in.rdb, append([]cache.Option{
			cache.WithTTL(spec.TTL), cache.WithoutJitter(), cache.WithEarlyRefresh(0),
			cache.WithPrefix(spec.Prefix), cache.WithNearCache(nearBudget), cache.WithNearShared(),
			cache.WithObserver(func(e cache.Event) {
				if e.Kind == cache.EventNearHit {
					in.nearHits.Add(1)
				}
			}),
		}, cacheOptions[spec.Strategy]...)...)
		key := spec.Key[len(spec.Prefix):]
		in.get = func(ctx context.Context) (Product, error) { return c.GetOrLoad(ctx, key, in.load) }
		in.closeCache = c.Close
	default:
		in.close()
		return nil, fmt.Errorf("unknown strategy %q", spec.Strategy)
	}
	return in, nil
}

func (in *instance) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if in.closeCache != nil {
		_ = in.closeCache() // its subscriptions, before the client they use
	}
	_ = in.mdb.Disconnect(ctx)
	_ = in.rdb.Close()
}

// load is the database read: a FindOne by _id, then the added delay of a
// heavy query. Every call is one find on the server, and is recorded.
func (in *instance) load(ctx context.Context) (Product, error) {
	start := time.Now()
	var p Product
	err := in.coll.FindOne(ctx, bson.D{{Key: "_id", Value: hotID}}).Decode(&p)
	if errors.Is(err, mongo.ErrNoDocuments) {
		err = errNoProduct // not cache.ErrNotFound: the product must exist
	}
	if err == nil && in.spec.LoadDelay > 0 {
		t := time.NewTimer(in.spec.LoadDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			err = ctx.Err()
		}
	}
	sp := span{Start: start.UnixNano(), End: time.Now().UnixNano()}
	in.mu.Lock()
	in.loads = append(in.loads, sp)
	in.mu.Unlock()
	in.live.addSpans(sp)
	in.live.loads.Add(1)
	return p, err
}

// naive is cache-aside as most code writes it: GET; on a miss load and SET.
// Nothing stops every caller that misses from loading.
func (in *instance) naive(ctx context.Context) (Product, error) {
	var p Product
	b, err := in.rdb.Get(ctx, in.spec.Key).Bytes()
	if err == nil {
		return p, json.Unmarshal(b, &p)
	}
	if !errors.Is(err, redis.Nil) {
		return p, err
	}
	if p, err = in.load(ctx); err != nil {
		return p, err
	}
	if b, err = json.Marshal(p); err != nil {
		return p, err
	}
	return p, in.rdb.Set(ctx, in.spec.Key, b, in.spec.TTL).Err()
}

// run waits for start, then sends requests from the spec's goroutines until
// stop is closed (see [window]). Requests in flight at the end are finished,
// not cancelled, so that no error is an artefact of stopping.
func (in *instance) run(ctx context.Context, start, stop <-chan struct{}) tally {
	<-start
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return ctx.Err() != nil
		}
	}
	tallies := make([]tally, in.spec.Goroutines)
	var wg sync.WaitGroup
	for i := range tallies {
		wg.Go(func() {
			t := &tallies[i]
			t.Latency = hist{}
			for !stopped() {
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				t0 := time.Now()
				p, err := in.get(rctx)
				t.Latency.add(time.Since(t0))
				cancel()
				t.Requests++
				in.live.requests.Add(1)
				if err == nil && p.SKU != hotID {
					err = fmt.Errorf("got product %q; want %q", p.SKU, hotID)
				}
				if err != nil {
					t.Errors++
					if t.FirstError == "" {
						t.FirstError = err.Error()
					}
				}
			}
		})
	}
	wg.Wait()
	var total tally
	for _, t := range tallies {
		total.merge(t)
	}
	in.mu.Lock()
	total.Loads = append(total.Loads, in.loads...)
	in.mu.Unlock()
	total.RedisSent = in.sent.Load()
	total.NearHits = in.nearHits.Load()
	return total
}

// countHook counts every command a client sends, pipelined ones included.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
