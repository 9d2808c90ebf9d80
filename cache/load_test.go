// This file proves GetOrLoad's behaviour in one process against a real
// Redis: merging, locking, the fenced commit, errors and bad input.

package cache

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"net"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGetOrLoadColdKeyLoadsOnceFor300Goroutines(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb)
	src := &counter{delay: 50 * time.Millisecond}

	vals, errs := stampede(t, []*Cache[product]{c}, 300, p+"hot", src.load)

	for i := range vals {
		require.NoError(t, errs[i])
		assert.Equal(t, "p1", vals[i].ID)
	}
	if got := src.calls.Load(); got != 1 {
		t.Fatalf("loader called %d times for 300 concurrent callers; want 1", got)
	}
	// The value is at exactly the key: a header, the freshness metadata
	// (early refresh is on by default), then the JSON, readable by others.
	raw, err := rdb.Get(t.Context(), p+"hot").Bytes()
	require.NoError(t, err)
	assert.Equal(t, []byte{record.V1, record.FlagFreshness, record.FreshnessLen}, raw[:record.HeaderLen])
	assert.JSONEq(t, `{"id":"p1","price":1,"tags":{"sale":"yes"}}`, string(raw[record.HeaderLen+record.FreshnessLen:]))
}

func TestGetOrLoadHitsAreMergedIntoOneGet(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "hot"
	c := New[product](rdb, WithoutNearCache()) // it counts GETs, and adds hooks to a client in use
	_, err := c.GetOrLoad(t.Context(), key, (&counter{}).load)
	require.NoError(t, err)

	// Slow the GET down so that every caller arrives while the first is in flight.
	cmds := redistest.CountCommands(rdb)
	rdb.AddHook(redistest.Delay(redistest.Named("get"), 300*time.Millisecond))
	src := &counter{}
	vals, errs := stampede(t, []*Cache[product]{c}, 100, key, src.load)
	for i := range vals {
		require.NoError(t, errs[i])
		assert.Equal(t, "p1", vals[i].ID)
	}
	// One GET for the callers that joined before it was sent, at most one
	// more for those that joined while it was on the way: a Delete elsewhere
	// may have come between (see TestCallerAfterDeleteElsewhere...).
	if got := cmds.Count("get"); got > 2 {
		t.Fatalf("100 concurrent hits sent %d GETs; want 1 or 2", got)
	}
	assert.Zero(t, src.calls.Load(), "a hit must not call the loader")
}

func TestGetOrLoadInstancesWithOwnClientsLoadOnce(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	addr := redistest.Addr(t)
	var caches []*Cache[product]
	for range 8 {
		caches = append(caches, New[product](redistest.Client(t, addr)))
	}
	src := &counter{delay: 200 * time.Millisecond}

	_, errs := stampede(t, caches, 40, p+"hot", src.load)

	for _, err := range errs {
		require.NoError(t, err)
	}
	if got := src.calls.Load(); got != 1 {
		t.Fatalf("loader called %d times across 8 instances x 40 goroutines; want 1", got)
	}
}

func TestGetOrLoadCallersGetTheirOwnCopy(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb)
	src := &counter{delay: 50 * time.Millisecond}
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			v, err := c.GetOrLoad(t.Context(), p+"k", src.load)
			if err != nil {
				t.Error(err)
				return
			}
			if v.Tags["sale"] != "yes" {
				t.Errorf("caller %d saw tags %v; want sale=yes (another caller's write leaked in)", i, v.Tags)
			}
			v.Tags["sale"] = fmt.Sprint(i) // the race detector catches a shared map
		})
	}
	wg.Wait()
}

func TestGetOrLoadMergedCallersAllSeeWhatIsStored(t *testing.T) {
	t.Parallel()
	// A field the codec drops: the holder's own caller must not see more than
	// the callers who decode the stored bytes.
	type secret struct {
		Public  string
		Private string `json:"-"`
	}
	rdb, p := setup(t)
	c := New[secret](rdb)
	load := func(context.Context) (secret, error) {
		time.Sleep(50 * time.Millisecond)
		return secret{Public: "a", Private: "b"}, nil
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			v, err := c.GetOrLoad(t.Context(), p+"k", load)
			assert.NoError(t, err)
			assert.Equal(t, secret{Public: "a"}, v, "every caller gets what the cache stores")
		})
	}
	wg.Wait()
}

func TestGetOrLoadLostReplyToTheLockScript(t *testing.T) {
	t.Parallel()
	// go-redis resends a command whose reply was lost. Simulate that for the
	// read-or-lock script: run it twice and keep the second reply. The lock
	// taken by the first run is ours, so the load must go ahead at once.
	rdb, p := setup(t)
	rdb.AddHook(redistest.Resend(redistest.IsScript))
	c := New[product](rdb, WithLockTTL(5*time.Second), WithRetry(3, 10*time.Millisecond))
	src := &counter{}
	start := time.Now()
	v, err := c.GetOrLoad(t.Context(), p+"k", src.load)
	require.NoError(t, err)
	assert.Equal(t, "p1", v.ID)
	assert.Equal(t, int64(1), src.calls.Load())
	assert.Less(t, time.Since(start), 2*time.Second, "the holder must not wait on its own lock")
}

func TestGetOrLoadLockReleasedWhenTheScriptReplyIsLost(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	rdb.AddHook(redistest.LoseReplies(redistest.IsScript, 1<<30))
	c := New[product](rdb, WithLockTTL(time.Minute), WithFailurePolicy(FailClosed))
	_, err := c.GetOrLoad(t.Context(), key, (&counter{}).load)
	require.ErrorContains(t, err, "reply lost")
	// The script did take the lock; others must not wait a whole lease for it.
	other := redistest.Client(t, redistest.Addr(t))
	waitFor(t, func() bool { return other.Exists(t.Context(), LockKey(key)).Val() == 0 })
}

func TestGetOrLoadWatchdogKeepsASlowLoadSingle(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "slow"
	// Not much shorter: on a loaded 2-core CI machine a refresh can be late by
	// tens of milliseconds, and a lease that short is lost for real.
	const lockTTL = 600 * time.Millisecond
	holder := New[product](rdb, WithLockTTL(lockTTL))
	waiter := New[product](redistest.Client(t, redistest.Addr(t)), WithLockTTL(lockTTL), WithRetry(300, 20*time.Millisecond))

	src := &counter{delay: 4 * lockTTL}
	done := make(chan error, 1)
	go func() { _, err := holder.GetOrLoad(t.Context(), key, src.load); done <- err }()
	waitFor(t, func() bool { return src.calls.Load() == 1 })

	_, err := waiter.GetOrLoad(t.Context(), key, src.load)
	require.NoError(t, err)
	require.NoError(t, <-done)
	if got := src.calls.Load(); got != 1 {
		t.Fatalf("a load 4x longer than the lock TTL ran %d times; want 1 (the watchdog must extend the lock)", got)
	}
}

func TestGetOrLoadRetriesExhausted(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	require.NoError(t, rdb.Set(t.Context(), LockKey(key), "someone-else", time.Minute).Err())
	c := New[product](rdb, WithRetry(3, 50*time.Millisecond))
	src := &counter{}

	start := time.Now()
	_, err := c.GetOrLoad(t.Context(), key, src.load)
	elapsed := time.Since(start)

	if !errors.Is(err, ErrLockNotAcquired) {
		t.Fatalf("GetOrLoad with the lock held elsewhere = %v; want ErrLockNotAcquired", err)
	}
	// 3 retries x 50ms: loose bounds, the point is it neither spins nor hangs.
	assert.GreaterOrEqual(t, elapsed, 150*time.Millisecond)
	assert.Less(t, elapsed, 2*time.Second)
	assert.Zero(t, src.calls.Load())
	assert.Contains(t, err.Error(), key, "the error must name the key")
	assert.Contains(t, err.Error(), "3 retries 50ms apart", "the error must name the budget")
}

func TestGetOrLoadNoRetries(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	require.NoError(t, rdb.Set(t.Context(), LockKey(key), "someone-else", time.Minute).Err())
	_, err := New[product](rdb, WithRetry(0, 0)).GetOrLoad(t.Context(), key, (&counter{}).load)
	assert.ErrorIs(t, err, ErrLockNotAcquired)
}

func TestGetOrLoadWaiterSeesAValueWrittenMeanwhile(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	require.NoError(t, rdb.Set(t.Context(), LockKey(key), "someone-else", time.Minute).Err())
	go func() {
		time.Sleep(150 * time.Millisecond)
		rdb.Set(context.Background(), key, record.Encode(0, []byte(`{"id":"from-other"}`)), time.Minute)
	}()
	src := &counter{}
	v, err := New[product](rdb, WithRetry(50, 20*time.Millisecond)).GetOrLoad(t.Context(), key, src.load)
	require.NoError(t, err)
	assert.Equal(t, "from-other", v.ID, "the waiter must re-read the cache between attempts")
	assert.Zero(t, src.calls.Load())
}

func TestGetOrLoadLoaderErrorIsReturnedUnchangedAndNotCached(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	c := New[product](rdb)
	errDB := errors.New("db is down")

	for _, tc := range []struct {
		name string
		load func(context.Context) (product, error)
		want func(error) bool
	}{
		{"error", func(context.Context) (product, error) { return product{}, fmt.Errorf("query: %w", errDB) },
			func(err error) bool { return errors.Is(err, errDB) }},
		{"panic", func(context.Context) (product, error) { panic("boom") },
			func(err error) bool { return err != nil && strings.Contains(err.Error(), "loader panicked: boom") }},
		{"panic with error", func(context.Context) (product, error) { panic(errDB) },
			func(err error) bool { return errors.Is(err, errDB) }},
		{"Goexit", func(context.Context) (product, error) { runtime.Goexit(); return product{}, nil },
			func(err error) bool { return err != nil && strings.Contains(err.Error(), "runtime.Goexit") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() {
					_, err := c.GetOrLoad(t.Context(), key, tc.load)
					if !tc.want(err) {
						t.Errorf("GetOrLoad = %v; want the loader's %s", err, tc.name)
					}
				})
			}
			wg.Wait()
			n, err := rdb.Exists(t.Context(), key, LockKey(key)).Result()
			require.NoError(t, err)
			assert.Zero(t, n, "after a failed load neither a value nor the lock may remain")

			src := &counter{}
			_, err = c.GetOrLoad(t.Context(), key, src.load)
			require.NoError(t, err)
			assert.Equal(t, int64(1), src.calls.Load(), "the error must not be cached")
			require.NoError(t, c.Delete(t.Context(), key))
		})
	}
}

func TestGetOrLoadNotFoundIsCached(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	var calls atomic.Int64
	missing := func(context.Context) (product, error) { calls.Add(1); return product{}, ErrNotFound }

	c := New[product](rdb, WithNotFoundTTL(time.Minute))
	for range 3 {
		_, err := c.GetOrLoad(t.Context(), p+"absent", missing)
		require.ErrorIs(t, err, ErrNotFound)
	}
	assert.Equal(t, int64(1), calls.Load(), "a not-found answer must be cached")
	ttl := rdb.PTTL(t.Context(), p+"absent").Val()
	assert.Greater(t, ttl, 50*time.Second)
	assert.LessOrEqual(t, ttl, time.Minute)

	calls.Store(0)
	off := New[product](rdb, WithNotFoundTTL(0))
	for range 3 {
		_, err := off.GetOrLoad(t.Context(), p+"absent-uncached", missing)
		require.ErrorIs(t, err, ErrNotFound)
	}
	assert.Equal(t, int64(3), calls.Load(), "WithNotFoundTTL(0) must not cache not-found")
	assert.Zero(t, rdb.Exists(t.Context(), p+"absent-uncached", LockKey(p+"absent-uncached")).Val())
}

func TestGetOrLoadUnreadableValueIsAMissAndReplaced(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		write func(ctx context.Context, rdb *redis.Client, key string) error
	}{
		{"foreign string", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.Set(ctx, key, "written by another program", 0).Err()
		}},
		{"empty string", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.Set(ctx, key, "", 0).Err()
		}},
		{"future version", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.Set(ctx, key, []byte{record.V1 + 1, 0, 0, '{', '}'}, 0).Err()
		}},
		{"unknown required flag", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.Set(ctx, key, []byte{record.V1, 0x02, 0, '{', '}'}, 0).Err()
		}},
		{"metadata longer than the record", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.Set(ctx, key, []byte{record.V1, 0x10, 9, '{', '}'}, 0).Err()
		}},
		{"payload of another type", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.Set(ctx, key, record.Encode(0, []byte(`[1,2,3]`)), 0).Err()
		}},
		{"truncated JSON", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.Set(ctx, key, record.Encode(0, []byte(`{"id":"p`)), 0).Err()
		}},
		{"hash (WRONGTYPE)", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.HSet(ctx, key, "f", "v").Err()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, p := setup(t)
			key := p + "k"
			require.NoError(t, tc.write(t.Context(), rdb, key))
			src := &counter{}
			c := New[product](rdb, WithRetry(3, 10*time.Millisecond))

			v, err := c.GetOrLoad(t.Context(), key, src.load)
			require.NoError(t, err)
			assert.Equal(t, "p1", v.ID)
			assert.Equal(t, int64(1), src.calls.Load())

			v, err = c.GetOrLoad(t.Context(), key, src.load)
			require.NoError(t, err)
			assert.Equal(t, "p1", v.ID)
			assert.Equal(t, int64(1), src.calls.Load(), "the unreadable value must have been replaced")
		})
	}
}

func TestDeleteDuringLoadWins(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	c := New[product](rdb)
	loading, release := make(chan struct{}), make(chan struct{})
	stale := func(context.Context) (product, error) {
		close(loading)
		<-release
		return product{ID: "stale"}, nil
	}
	done := make(chan product, 1)
	go func() { v, _ := c.GetOrLoad(context.Background(), key, stale); done <- v }()

	<-loading
	require.NoError(t, c.Delete(t.Context(), key))
	close(release)
	assert.Equal(t, "stale", (<-done).ID, "the holder's caller still gets what it loaded")

	n, err := rdb.Exists(t.Context(), key, LockKey(key)).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a load that began before Delete must not write its stale value")

	v, err := c.GetOrLoad(t.Context(), key, (&counter{}).load)
	require.NoError(t, err)
	assert.Equal(t, "p1", v.ID, "the next read loads fresh data")
}

func TestDeleteKeysAndLocks(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb)
	keys := []string{p + "a", p + "{tag}b", p + "c}", p + "}{", p + "{}x", p + "x{", p + "sp ace\n\x00", p + strings.Repeat("}", 4096)}
	for _, k := range keys {
		_, err := c.GetOrLoad(t.Context(), k, (&counter{}).load)
		require.NoError(t, err)
		require.NoError(t, rdb.Set(t.Context(), LockKey(k), "x", time.Minute).Err())
	}
	require.NoError(t, c.Delete(t.Context(), keys...))
	for _, k := range keys {
		assert.Zero(t, rdb.Exists(t.Context(), k, LockKey(k)).Val(), "key %q or its lock survived Delete", k)
	}
	assert.ErrorIs(t, c.Delete(t.Context(), p+"a", ""), ErrEmptyKey)
}

func TestGetOrLoadCancelledCallerReturnsPromptly(t *testing.T) {
	// Not parallel: it times the cancelled caller to 300 ms.
	rdb, p := setup(t)
	key := p + "k"
	c := New[product](rdb)
	var loaderCtxErr atomic.Value
	slow := func(ctx context.Context) (product, error) {
		time.Sleep(400 * time.Millisecond)
		loaderCtxErr.Store(fmt.Sprint(ctx.Err()))
		return product{ID: "p1"}, nil
	}

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	other := make(chan error, 1)
	go func() {
		time.Sleep(10 * time.Millisecond)
		_, err := c.GetOrLoad(t.Context(), key, slow)
		other <- err
	}()
	start := time.Now()
	_, err := c.GetOrLoad(ctx, key, slow)
	elapsed := time.Since(start)

	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, elapsed, 300*time.Millisecond, "a cancelled caller must not wait for the load")
	require.NoError(t, <-other, "another caller of the same flight must be unaffected")
	assert.Equal(t, "<nil>", loaderCtxErr.Load(), "the loader's context must not be cancelled by a caller")
	assert.Equal(t, byte(record.V1), rdb.Get(t.Context(), key).Val()[0], "the value must be cached")
}

func TestGetOrLoadLoadTimeoutAbandonsALoaderThatIgnoresIt(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	c := New[product](rdb, WithLoadTimeout(200*time.Millisecond))
	stuck, returned := make(chan struct{}), make(chan struct{})
	var started atomic.Bool
	t.Cleanup(func() { // let it end before the leak check
		close(stuck)
		if started.Load() {
			<-returned
		}
	})
	ignoring := func(context.Context) (product, error) {
		started.Store(true)
		defer close(returned)
		<-stuck // ignores its context
		return product{ID: "late"}, nil
	}

	start := time.Now()
	_, err := c.GetOrLoad(t.Context(), key, ignoring) // no deadline of its own
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, started.Load(), "the loader must have been called")
	assert.Less(t, time.Since(start), 3*time.Second, "the load timeout must end the flight")
	assert.Zero(t, rdb.Exists(t.Context(), key, LockKey(key)).Val(), "the lock must be released, nothing stored")

	// The key is not poisoned: the next caller in this process loads afresh.
	v, err := c.GetOrLoad(t.Context(), key, (&counter{}).load)
	require.NoError(t, err)
	assert.Equal(t, "p1", v.ID)
}

func TestGetOrLoadNotFoundErrorsKeepTheirMeaning(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb)

	// A panic is a failure even when it carries ErrNotFound: nothing cached.
	_, err := c.GetOrLoad(t.Context(), p+"panic", func(context.Context) (product, error) { panic(ErrNotFound) })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "panicked")
	assert.Zero(t, rdb.Exists(t.Context(), p+"panic").Val(), "a panic must not be cached as not-found")

	// A wrapped ErrNotFound is a not-found, the same error as a cached one
	// (see TestNotFoundIsTheSameErrorOnEveryCall).
	wrapped := fmt.Errorf("product 7: %w", ErrNotFound)
	_, err = c.GetOrLoad(t.Context(), p+"wrapped", func(context.Context) (product, error) { return product{}, wrapped })
	assert.ErrorIs(t, err, ErrNotFound)
	_, err = c.GetOrLoad(t.Context(), p+"wrapped", (&counter{}).load)
	assert.ErrorIs(t, err, ErrNotFound, "later callers read the cached not-found record")
}

func TestGetOrLoadCodecPanicIsAnError(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithCodec(panicCodec{}))

	// Encoding a loaded value: an error, and the lock is released at once.
	_, err := c.GetOrLoad(t.Context(), p+"k", (&counter{}).load)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cache: codec panicked: codec broke")
	assert.Zero(t, rdb.Exists(t.Context(), p+"k", LockKey(p+"k")).Val())

	// Decoding a hit: an error for the caller, not a crash of the process.
	require.NoError(t, rdb.Set(t.Context(), p+"hit", record.Encode(0, []byte(`{}`)), time.Minute).Err())
	_, err = c.GetOrLoad(t.Context(), p+"hit", (&counter{}).load)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cache: codec panicked: codec broke")
}

type panicCodec struct{}

func (panicCodec) Marshal(any) ([]byte, error) { panic("codec broke") }
func (panicCodec) Unmarshal([]byte, any) error { panic("codec broke") }

func TestErrorHookSeesWhatCallersDoNot(t *testing.T) {
	t.Parallel()
	t.Run("a Delete voiding a load is an event, not an error", func(t *testing.T) {
		rdb, p := setup(t)
		var got []error
		var mu sync.Mutex
		hook := WithErrorHook(func(_ string, err error) { mu.Lock(); got = append(got, err); mu.Unlock() })
		var voided atomic.Int64
		c := New[product](rdb, hook, eventCount(EventLoadVoided, &voided))
		loading, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := c.GetOrLoad(context.Background(), p+"k", func(context.Context) (product, error) {
				close(loading)
				<-release
				return product{ID: "stale"}, nil
			})
			done <- err
		}()
		<-loading
		require.NoError(t, c.Delete(t.Context(), p+"k"))
		close(release)
		require.NoError(t, <-done)
		mu.Lock()
		defer mu.Unlock()
		assert.Empty(t, got, "the write won, as designed: nothing for the error hook")
		assert.Equal(t, int64(1), voided.Load())
	})
	t.Run("Redis error under FailOpen", func(t *testing.T) {
		dead := redis.NewClient(&redis.Options{Addr: deadAddr(t), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		t.Cleanup(func() { dead.Close() })
		var keys []string
		c := New[product](dead, WithErrorHook(func(key string, err error) {
			keys = append(keys, key)
			assert.Contains(t, err.Error(), "cache: redis:")
		}))
		_, err := c.GetOrLoad(t.Context(), "k", (&counter{}).load)
		require.NoError(t, err)
		assert.Equal(t, []string{"k"}, keys)
	})
}

func TestGetOrLoadBadInput(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb)

	_, err := c.GetOrLoad(t.Context(), "", (&counter{}).load)
	assert.ErrorIs(t, err, ErrEmptyKey)
	_, err = c.GetOrLoad(t.Context(), p+"k", nil)
	assert.ErrorIs(t, err, ErrNilLoader)

	// A value the codec cannot encode: returned, nothing cached, lock
	// released, the error counted and told to the hook once per key.
	var hooked []error
	fc := New[func()](rdb, WithErrorHook(func(_ string, err error) { hooked = append(hooked, err) }))
	for range 3 {
		f, err := fc.GetOrLoad(t.Context(), p+"func", func(context.Context) (func(), error) { return func() {}, nil })
		require.NoError(t, err, "a loaded value the codec cannot encode is still the caller's")
		assert.NotNil(t, f)
	}
	assert.Equal(t, int64(3), fc.Stats().EncodeErrors)
	require.Len(t, hooked, 1)
	assert.Contains(t, hooked[0].Error(), "cache: encode value")
	assert.Zero(t, rdb.Exists(t.Context(), p+"func", LockKey(p+"func")).Val())
}

func TestGetOrLoadPrefixAndTTL(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	// Without early refresh: with it Redis keeps a value three load
	// durations past its TTL (the refresh grace), and a load that took 1 ms
	// on a busy machine made the PTTL 10.003s.
	c := New[product](rdb, WithPrefix(p), WithTTL(10*time.Second), WithoutJitter(), WithEarlyRefresh(0), WithoutNearCache())
	_, err := c.GetOrLoad(t.Context(), "k", (&counter{}).load)
	require.NoError(t, err)
	ttl := rdb.PTTL(t.Context(), p+"k").Val()
	assert.Greater(t, ttl, 9*time.Second)
	assert.LessOrEqual(t, ttl, 10*time.Second)

	j := New[product](rdb, WithTTL(100*time.Second), WithJitter(0.5), WithEarlyRefresh(0))
	var lo, hi time.Duration = time.Hour, 0
	for i := range 20 {
		key := fmt.Sprintf("%sj%d", p, i)
		_, err := j.GetOrLoad(t.Context(), key, (&counter{}).load)
		require.NoError(t, err)
		ttl := rdb.PTTL(t.Context(), key).Val()
		lo, hi = min(lo, ttl), max(hi, ttl)
	}
	assert.GreaterOrEqual(t, lo, 49*time.Second)
	assert.LessOrEqual(t, hi, 150*time.Second)
	assert.Greater(t, hi-lo, 10*time.Second, "jitter must spread TTLs (20 draws from [50s,150s])")
}

func TestGetOrLoadRedisDown(t *testing.T) {
	t.Parallel()
	dead := redis.NewClient(&redis.Options{Addr: deadAddr(t), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { dead.Close() })

	t.Run("fail open loads once per process, uncached", func(t *testing.T) {
		c := New[product](dead)
		src := &counter{delay: 100 * time.Millisecond}
		vals, errs := stampede(t, []*Cache[product]{c}, 50, "k", src.load)
		for i := range vals {
			require.NoError(t, errs[i])
			assert.Equal(t, "p1", vals[i].ID)
		}
		// One load for the callers that joined before it began; those that
		// joined while it ran may have begun after a Delete elsewhere, so they
		// share one more (see TestDeleteWhileAnInstanceLoadsWithoutRedis).
		assert.LessOrEqual(t, src.calls.Load(), int64(2), "in-process callers must still be merged")
	})
	t.Run("fail closed returns the Redis error", func(t *testing.T) {
		c := New[product](dead, WithFailurePolicy(FailClosed))
		src := &counter{}
		_, err := c.GetOrLoad(t.Context(), "k", src.load)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "cache: redis")
		assert.Zero(t, src.calls.Load())
	})
}

// blackHole returns the address of a listener that accepts connections and
// never answers, like a Redis behind a dead network path.
func blackHole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var conns sync.WaitGroup
	stop := make(chan struct{})
	t.Cleanup(func() { l.Close(); close(stop); conns.Wait() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Go(func() { <-stop; c.Close() })
		}
	}()
	return l.Addr().String()
}

func TestGetOrLoadRedisThatNeverAnswersDoesNotHang(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		opt    redis.Options
		policy FailurePolicy
		wantOK bool
	}{
		// The client's read timeout ends the GET; fail-open then loads.
		{"client timeout, fail open", redis.Options{ReadTimeout: 100 * time.Millisecond}, FailOpen, true},
		{"client timeout, fail closed", redis.Options{ReadTimeout: 100 * time.Millisecond}, FailClosed, false},
		// No client timeouts: only the load timeout can end the flight, and
		// go-redis honours it only with ContextTimeoutEnabled. (FailClosed:
		// the socket deadline and the context's timer fire together, so under
		// FailOpen the outcome may be either an error or a fresh load.)
		{"load timeout", redis.Options{ReadTimeout: -1, WriteTimeout: -1, ContextTimeoutEnabled: true}, FailClosed, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt := tc.opt
			opt.Addr, opt.MaxRetries = blackHole(t), -1
			rdb := redis.NewClient(&opt)
			t.Cleanup(func() { rdb.Close() })
			c := New[product](rdb, WithLoadTimeout(300*time.Millisecond), WithFailurePolicy(tc.policy))

			start := time.Now()
			v, err := c.GetOrLoad(t.Context(), "k", (&counter{}).load)
			elapsed := time.Since(start)
			if tc.wantOK {
				require.NoError(t, err)
				assert.Equal(t, "p1", v.ID)
			} else {
				assert.Error(t, err)
			}
			assert.Less(t, elapsed, 3*time.Second, "GetOrLoad must not hang on a Redis that never answers")
		})
	}
}

func TestDoNotCacheCallersMergedWithTheLoadGetItsValue(t *testing.T) {
	t.Parallel()
	// Callers who join a running load that calls DoNotCache share its value:
	// the lock still held at its release vouches that no Delete or Set came
	// between, as a commit does.
	for _, notFound := range []bool{false, true} {
		t.Run(fmt.Sprintf("notFound=%v", notFound), func(t *testing.T) {
			rdb, p := setup(t)
			c := New[product](rdb, WithNotFoundTTL(0))
			var loads atomic.Int64
			loading := make(chan struct{})
			load := func(ctx context.Context) (product, error) {
				if loads.Add(1) == 1 {
					close(loading)
				}
				time.Sleep(100 * time.Millisecond) // the 20 others join meanwhile
				DoNotCache(ctx)
				if notFound {
					return product{}, ErrNotFound
				}
				return product{ID: "v"}, nil
			}
			var wg sync.WaitGroup
			call := func() {
				v, err := c.GetOrLoad(t.Context(), p+"k", load)
				if notFound {
					assert.ErrorIs(t, err, ErrNotFound)
				} else if assert.NoError(t, err) {
					assert.Equal(t, "v", v.ID)
				}
			}
			wg.Go(call)
			<-loading
			for range 20 {
				wg.Go(call)
			}
			wg.Wait()
			if got := loads.Load(); got != 1 {
				t.Fatalf("21 callers of a DoNotCache load caused %d loads; want 1", got)
			}
			assert.Zero(t, rdb.Exists(t.Context(), p+"k", LockKey(p+"k")).Val())
		})
	}
}

func TestGetOrLoadCallersMergedOnAHitGetTheirOwnCopy(t *testing.T) {
	t.Parallel()
	// The flight decodes a hit once for the first caller to take it; every
	// other caller merged on that read must decode a copy of its own.
	rdb, p := setup(t)
	key := p + "k"
	c := New[product](rdb, WithoutNearCache()) // it counts GETs, and adds hooks to a client in use
	_, err := c.GetOrLoad(t.Context(), key, (&counter{}).load)
	require.NoError(t, err)
	cmds := redistest.CountCommands(rdb)
	rdb.AddHook(redistest.Delay(redistest.Named("get", "mget"), 200*time.Millisecond)) // the callers join while the read is out

	const callers = 20
	vals := make([]product, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			v, err := c.GetOrLoad(t.Context(), key, (&counter{}).load)
			assert.NoError(t, err)
			vals[i] = v
		})
	}
	wg.Wait()
	require.LessOrEqual(t, cmds.Count("get")+cmds.Count("mget"), 2, "the callers were not merged on one read")

	vals[0].Tags["sale"] = "changed by caller 0"
	shared := 0
	for i := 1; i < callers; i++ {
		if vals[i].Tags["sale"] != "yes" {
			shared++
		}
	}
	if shared > 0 {
		t.Fatalf("%d of %d callers merged on a hit saw caller 0's change to its map; want 0", shared, callers-1)
	}
}

// stallHook holds every run of script after the first until its context
// ends, then fails it as go-redis does: the load timeout falling inside a
// call, as it does when a wait's last retry meets the deadline.
type stallHook struct {
	sha  string
	runs atomic.Int64
}

func (h *stallHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *stallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); cmd.Name() == "evalsha" && len(args) > 1 && args[1] == h.sha && h.runs.Add(1) > 1 {
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		return next(ctx, cmd)
	}
}
func (h *stallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestGetOrLoadLoadTimeoutDuringARetryIsNotAcquired: a waiter whose load
// timeout ends while a retry's read-or-lock is in flight ran out of budget;
// it is ErrLockNotAcquired naming the key, not a Redis outage, and the
// breaker and the health log hear nothing of it (Redis answered every call).
func TestGetOrLoadLoadTimeoutDuringARetryIsNotAcquired(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	key := p + "k"
	require.NoError(t, rdb.Set(t.Context(), LockKey(key), "someone-else", time.Minute).Err())
	loadScripts(t, rdb)
	waiter := redistest.Client(t, redistest.Addr(t))
	hook := &stallHook{sha: readOrLockScript.Hash()}
	waiter.AddHook(hook)
	var redisErrs atomic.Int64
	c := New[product](waiter, WithoutNearCache(), WithLoadTimeout(300*time.Millisecond), eventCount(EventRedisError, &redisErrs))
	src := &counter{}

	_, err := c.GetOrLoad(t.Context(), key, src.load)

	require.GreaterOrEqual(t, hook.runs.Load(), int64(2), "the second read-or-lock must have been stalled")
	require.ErrorIs(t, err, ErrLockNotAcquired)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), key)
	assert.Contains(t, err.Error(), "300ms")
	assert.Zero(t, redisErrs.Load(), "EventRedisError: the wait's own deadline is not a Redis error")
	assert.Zero(t, src.calls.Load())
}
