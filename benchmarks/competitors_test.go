// This file adapts each library under comparison to one small
// interface, so the benchmarks drive them all the same way.
package benchmarks

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/bsm/redislock"
	gocache "github.com/go-redis/cache/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidisaside"
	"github.com/stampede-go/stampede/cache"
)

// instance is one "process" of a competitor: its own Redis client and its
// own cache object. It must be safe for concurrent use.
type instance interface {
	Get(ctx context.Context, key string, load loadFunc) (Product, error)
	Close()
}

// competitor opens instances of one library on the Redis at addr, storing
// values for ttl.
type competitor struct {
	name string
	open func(addr string, ttl time.Duration) (instance, error)
	// hitOnly marks adapters that are not a complete read-through cache:
	// raw has no miss path worth measuring, and rueidisaside without
	// client-side caching cannot wake cross-process waiters (see its doc).
	hitOnly bool
}

// competitors is every adapter, in the order the results are printed.
var competitors = []competitor{
	{name: "raw", open: openRaw, hitOnly: true},
	{name: "naive", open: openNaive},
	{name: "go-redis-cache", open: openGoRedisCache},
	{name: "rueidisaside", open: openRueidisAside(true)},
	{name: "rueidisaside-nocsc", open: openRueidisAside(false), hitOnly: true},
	{name: "redislock-poll", open: openRedislockPoll},
	{name: "stampede", open: openStampede},
	// The near cache's rows: their miss path is stampede's own, measured in
	// its row, so they run in the hit benchmarks only.
	{name: "stampede-near", open: openStampedeNear(false), hitOnly: true},
	{name: "stampede-near-clone", open: openStampedeNearClone, hitOnly: true},
	{name: "stampede-near-shared", open: openStampedeNear(true), hitOnly: true},
	{name: "stampede-tracked", open: openStampedeTracked, hitOnly: true},
}

// loaders is the competitors that are read-through caches.
func loaders() []competitor {
	var cs []competitor
	for _, c := range competitors {
		if !c.hitOnly {
			cs = append(cs, c)
		}
	}
	return cs
}

// errMiss is raw's answer to a key that is not in Redis.
var errMiss = errors.New("benchmarks: raw: key not in Redis")

// seeder is implemented by adapters that cannot fill a key through Get.
type seeder interface {
	seed(ctx context.Context, key string, v Product) error
}

// rawInst is the floor for a hit: one go-redis GET and a JSON decode, no
// cache logic at all. It never calls the loader.
type rawInst struct {
	rdb *redis.Client
	ttl time.Duration
}

func openRaw(addr string, ttl time.Duration) (instance, error) {
	return &rawInst{rdb: redis.NewClient(&redis.Options{Addr: addr}), ttl: ttl}, nil
}

func (r *rawInst) Get(ctx context.Context, key string, _ loadFunc) (Product, error) {
	var v Product
	b, err := r.rdb.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return v, errMiss
	}
	if err != nil {
		return v, err
	}
	err = json.Unmarshal(b, &v)
	return v, err
}

func (r *rawInst) seed(ctx context.Context, key string, v Product) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return r.rdb.Set(ctx, key, b, r.ttl).Err()
}

func (r *rawInst) Close() { _ = r.rdb.Close() }

// naiveInst is cache-aside as most services first write it: GET, and on a
// miss load and SET, with no coordination at all.
type naiveInst struct{ rawInst }

func openNaive(addr string, ttl time.Duration) (instance, error) {
	return &naiveInst{rawInst{rdb: redis.NewClient(&redis.Options{Addr: addr}), ttl: ttl}}, nil
}

func (n *naiveInst) Get(ctx context.Context, key string, load loadFunc) (Product, error) {
	v, err := n.rawInst.Get(ctx, key, nil)
	if !errors.Is(err, errMiss) {
		return v, err
	}
	if v, err = load(ctx); err != nil {
		return v, err
	}
	return v, n.seed(ctx, key, v)
}

// goRedisCacheInst is github.com/go-redis/cache/v9 Once: singleflight in
// this process, nothing across processes. LocalCache is nil so that every
// hit is a Redis read, like the others; its codec is its own default
// (msgpack, s2 above 64 bytes), as its users get it.
type goRedisCacheInst struct {
	rdb *redis.Client
	c   *gocache.Cache
	ttl time.Duration
}

func openGoRedisCache(addr string, ttl time.Duration) (instance, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	return &goRedisCacheInst{rdb: rdb, c: gocache.New(&gocache.Options{Redis: rdb}), ttl: ttl}, nil
}

func (g *goRedisCacheInst) Get(ctx context.Context, key string, load loadFunc) (Product, error) {
	var v Product
	err := g.c.Once(&gocache.Item{
		Ctx:   ctx,
		Key:   key,
		Value: &v,
		TTL:   g.ttl, // go-redis/cache replaces a TTL under 1s with 1h: keep it >= 1s
		Do:    func(it *gocache.Item) (any, error) { return load(it.Context()) },
	})
	return v, err
}

func (g *goRedisCacheInst) Close() { _ = g.rdb.Close() }

// rueidisInst is github.com/redis/rueidis/rueidisaside: the lock is a
// placeholder stored in the key itself, and waiters are woken by RESP3
// client-side-caching invalidations. With csc, a hit is served from the
// client's memory after the first read of a key, tracked by Redis.
//
// Without client-side caching (DisableCache) nothing sends CLIENT TRACKING,
// so no invalidation ever arrives: a waiter in another process that finds
// the placeholder blocks until the TTL ends its context. That variant is
// only measured for hits, as "a Redis round trip per hit" figure.
type rueidisInst struct {
	cc  rueidisaside.CacheAsideClient
	c   rueidisaside.TypedCacheAsideClient[Product]
	ttl time.Duration
}

func openRueidisAside(csc bool) func(addr string, ttl time.Duration) (instance, error) {
	return func(addr string, ttl time.Duration) (instance, error) {
		cc, err := rueidisaside.NewClient(rueidisaside.ClientOption{
			ClientOption: rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: !csc},
		})
		if err != nil {
			return nil, err
		}
		// JSON, like raw and stampede, so the codec is not what differs.
		c := rueidisaside.NewTypedCacheAsideClient[Product](cc,
			func(v *Product) (string, error) {
				b, err := json.Marshal(v)
				return string(b), err
			},
			func(s string) (*Product, error) {
				var v Product
				err := json.Unmarshal([]byte(s), &v)
				return &v, err
			})
		return &rueidisInst{cc: cc, c: c, ttl: ttl}, nil
	}
}

func (r *rueidisInst) Get(ctx context.Context, key string, load loadFunc) (Product, error) {
	p, err := r.c.Get(ctx, r.ttl, key, func(ctx context.Context, _ string) (*Product, error) {
		v, err := load(ctx)
		return &v, err
	})
	if err != nil || p == nil {
		return Product{}, err
	}
	return *p, nil
}

func (r *rueidisInst) Close() { r.cc.Close() }

// redislockPollInst is the design of the articles this project started
// from, built on github.com/bsm/redislock: read the cache; on a miss obtain
// the lock with a linear 100ms retry; once obtained re-read the cache; load;
// set; release. Every caller polls on its own: no in-process merging.
type redislockPollInst struct {
	rawInst
	locker *redislock.Client
}

const (
	redislockTTL     = 5 * time.Second // the same lease as stampede's default
	redislockBackoff = 100 * time.Millisecond
	// redislockRetries is generous (30s of polling) so that waiters succeed
	// instead of erroring: every waiter takes the lock once, one at a time.
	redislockRetries = 300
)

func openRedislockPoll(addr string, ttl time.Duration) (instance, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	return &redislockPollInst{rawInst: rawInst{rdb: rdb, ttl: ttl}, locker: redislock.New(rdb)}, nil
}

func (r *redislockPollInst) Get(ctx context.Context, key string, load loadFunc) (Product, error) {
	v, err := r.rawInst.Get(ctx, key, nil)
	if !errors.Is(err, errMiss) {
		return v, err
	}
	// LimitRetry counts in a shared field, so it is made per call.
	opt := &redislock.Options{RetryStrategy: redislock.LimitRetry(redislock.LinearBackoff(redislockBackoff), redislockRetries)}
	// Without a deadline Obtain would stop waiting after one lease (5s).
	lctx, cancel := context.WithTimeout(ctx, redislockBackoff*redislockRetries)
	defer cancel()
	lock, err := r.locker.Obtain(lctx, key+":lock", redislockTTL, opt)
	if err != nil {
		return v, err
	}
	defer func() { _ = lock.Release(context.WithoutCancel(ctx)) }()
	if v, err = r.rawInst.Get(ctx, key, nil); !errors.Is(err, errMiss) {
		return v, err
	}
	if v, err = load(ctx); err != nil {
		return v, err
	}
	return v, r.seed(ctx, key, v)
}

// stampedeInst is this module's cache with its defaults, except jitter
// (the other libraries store exactly the TTL, so this one does too) and the
// near cache, off unless a row asks for it: "stampede" is the Redis path.
type stampedeInst struct {
	rdb  *redis.Client
	c    *cache.Cache[Product]
	call []cache.CallOption // given to every GetOrLoad
}

func openStampede(addr string, ttl time.Duration) (instance, error) {
	return openStampedeWith(addr, ttl)
}

// openStampedeWith is openStampede with more options, given after its own:
// BenchmarkRefresh and BenchmarkStale turn features on and off with them.
func openStampedeWith(addr string, ttl time.Duration, opts ...cache.Option) (*stampedeInst, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	opts = append([]cache.Option{cache.WithTTL(ttl), cache.WithoutJitter(), cache.WithoutNearCache()}, opts...)
	return &stampedeInst{rdb: rdb, c: cache.New[Product](rdb, opts...)}, nil
}

// openStampedeNear is stampede with a near cache of 64 MB (10,000 spread
// keys fit), a copy per caller or, with shared, one value for all.
func openStampedeNear(shared bool) func(addr string, ttl time.Duration) (instance, error) {
	return func(addr string, ttl time.Duration) (instance, error) {
		opts := []cache.Option{cache.WithPrefix("bench:"), cache.WithNearCache(64 << 20)}
		if shared {
			opts = append(opts, cache.WithNearShared())
		}
		return openStampedeWith(addr, ttl, opts...)
	}
}

// openStampedeTracked is stampede with an eventual near cache whose memory
// it never reads (SkipNear): every hit is a Redis hit through the tracked
// readers of per-key tracking, to set against stampede's row, whose reads
// go through the user's client.
func openStampedeTracked(addr string, ttl time.Duration) (instance, error) {
	in, err := openStampedeWith(addr, ttl, cache.WithPrefix("bench:"), cache.WithEventualNearCache(time.Hour))
	if err != nil {
		return nil, err
	}
	in.call = []cache.CallOption{cache.SkipNear()}
	return in, nil
}

// clonedProduct is a Product that copies itself, so that near-cache hits
// clone it instead of decoding JSON (see cache.WithNearCache).
type clonedProduct Product

func (p *clonedProduct) Clone() clonedProduct {
	c := *p
	c.Tags = slices.Clone(p.Tags)
	return c
}

// stampedeCloneInst is stampede with a near cache of values that clone
// themselves: a copy per caller without a decode.
type stampedeCloneInst struct {
	rdb *redis.Client
	c   *cache.Cache[clonedProduct]
}

func openStampedeNearClone(addr string, ttl time.Duration) (instance, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	return &stampedeCloneInst{rdb: rdb, c: cache.New[clonedProduct](rdb, cache.WithTTL(ttl), cache.WithoutJitter(),
		cache.WithPrefix("bench:"), cache.WithNearCache(64<<20))}, nil
}

func (s *stampedeCloneInst) Get(ctx context.Context, key string, load loadFunc) (Product, error) {
	v, err := s.c.GetOrLoad(ctx, key, func(ctx context.Context) (clonedProduct, error) {
		p, err := load(ctx)
		return clonedProduct(p), err
	})
	return Product(v), err
}

func (s *stampedeCloneInst) Close() {
	_ = s.c.Close()
	_ = s.rdb.Close()
}

func (s *stampedeInst) Get(ctx context.Context, key string, load loadFunc) (Product, error) {
	return s.c.GetOrLoad(ctx, key, load, s.call...)
}

// Close stops the cache's background work (refreshes, the notification
// subscription) before closing its client.
func (s *stampedeInst) Close() {
	_ = s.c.Close()
	_ = s.rdb.Close()
}
