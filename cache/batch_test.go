// This file proves GetOrLoadMany against a real Redis: round trips per
// batch, one load per key across instances and single-key callers, the
// fenced commit, errors, panics and cancellation; and measures it against
// GetOrLoad calls in parallel.

package cache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stampede-go/stampede/internal/token"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// source is a loadMany that records the keys of each call and returns a
// product per key, except those in absent; it can hold each call until
// released.
type source struct {
	mu      sync.Mutex // protects calls, perKey
	calls   [][]string
	perKey  map[string]int
	absent  map[string]bool
	delay   time.Duration
	entered chan struct{} // closed when the first call starts, if not nil
	release chan struct{} // each call waits for it, if not nil
	once    sync.Once
}

func (s *source) loadMany(ctx context.Context, keys []string) (map[string]product, error) {
	s.mu.Lock()
	s.calls = append(s.calls, slices.Clone(keys))
	if s.perKey == nil {
		s.perKey = map[string]int{}
	}
	for _, k := range keys {
		s.perKey[k]++
	}
	s.mu.Unlock()
	if s.entered != nil {
		s.once.Do(func() { close(s.entered) })
	}
	if s.release != nil {
		<-s.release
	}
	if s.delay > 0 {
		time.Sleep(s.delay)
	}
	m := make(map[string]product, len(keys))
	for _, k := range keys {
		if !s.absent[k] {
			m[k] = product{ID: k, Price: len(k)}
		}
	}
	return m, nil
}

func (s *source) callKeys() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

func (s *source) loads(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perKey[key]
}

// names returns n keys under p.
func names(p string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = p + "k" + strconv.Itoa(i)
	}
	return keys
}

// loadBatchScripts puts the batch's scripts in the server's cache, so that
// round trips are counted without the NOSCRIPT round of a fresh server.
func loadBatchScripts(tb testing.TB, rdb *redis.Client) {
	tb.Helper()
	for _, s := range []*redis.Script{readOrLockScript, commitScript, unlockScript} {
		require.NoError(tb, s.Load(context.Background(), rdb).Err())
	}
}

func TestGetOrLoadManyLoadsOnlyTheColdKeysInThreeRounds(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	loadBatchScripts(t, rdb)
	var ev eventCounts
	// It counts rounds with a hook added to a client in use (a race with the
	// near cache's lease renewals on go-redis v9.5.5).
	c := New[product](rdb, WithObserver(ev.observe), WithoutNearCache())
	keys := names(p, 100)
	var cold []string
	for i, k := range keys {
		if i%10 == 3 {
			cold = append(cold, k)
			continue
		}
		require.NoError(t, c.Set(t.Context(), k, product{ID: k, Price: -1}))
	}
	rounds := redistest.RecordRounds(rdb)
	src := &source{}

	got, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
	require.NoError(t, err)

	require.Len(t, src.callKeys(), 1, "loadMany must be called once")
	assert.ElementsMatch(t, cold, src.callKeys()[0], "loadMany must get exactly the cold keys")
	require.Len(t, got, 100)
	for i, k := range keys {
		want := product{ID: k, Price: -1}
		if i%10 == 3 {
			want.Price = len(k)
		}
		assert.Equal(t, want, got[k], "GetOrLoadMany()[%q]", k)
	}
	getRounds, gets := rounds.Count("get")
	lockRounds, scripts := rounds.Count("evalsha")
	assert.Equal(t, 1, getRounds, "GET rounds")
	assert.Equal(t, 100, gets, "GETs")
	assert.Equal(t, 2, lockRounds, "script rounds: one read-or-lock, one commit")
	assert.Equal(t, 20, scripts, "scripts: a read-or-lock and a commit per cold key")
	assert.Equal(t, 3, rounds.Total(), "round trips for the batch: %q", rounds.Rounds())
	assert.Equal(t, int64(90), ev[EventHit].Load(), "hits")
	assert.Equal(t, int64(10), ev[EventMiss].Load(), "misses")
	assert.Equal(t, int64(1), ev[EventLoad].Load(), "loads")
	for _, k := range cold {
		assert.Zero(t, rdb.Exists(t.Context(), LockKey(k)).Val(), "lock of %q left behind", k)
		assert.Equal(t, byte(record.V1), rdb.Get(t.Context(), k).Val()[0], "%q not stored", k)
	}

	// Warm: one round, no load.
	rounds.Reset()
	got, err = c.GetOrLoadMany(t.Context(), keys, src.loadMany)
	require.NoError(t, err)
	assert.Len(t, got, 100)
	assert.Len(t, src.callKeys(), 1, "a warm batch must not load")
	assert.Equal(t, 1, rounds.Total(), "round trips for a warm batch")
}

func TestGetOrLoadManyWatchdogKeepsASlowLoadSingle(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	keys := names(p, 3)
	const lockTTL = 600 * time.Millisecond // see TestGetOrLoadWatchdogKeepsASlowLoadSingle
	holder := New[product](rdb, WithLockTTL(lockTTL))
	waiter := New[product](redistest.Client(t, redistest.Addr(t)), WithLockTTL(lockTTL), WithRetry(300, 20*time.Millisecond))
	src := &source{delay: 4 * lockTTL, entered: make(chan struct{})}
	done := make(chan error, 1)
	go func() { _, err := holder.GetOrLoadMany(t.Context(), keys, src.loadMany); done <- err }()
	<-src.entered

	single := &counter{}
	v, err := waiter.GetOrLoad(t.Context(), keys[2], single.load)
	require.NoError(t, err)
	require.NoError(t, <-done)
	assert.Equal(t, keys[2], v.ID, "the batch's value")
	assert.Zero(t, single.calls.Load(), "a batch load 4x longer than the lock TTL must keep its locks")
	assert.Len(t, src.callKeys(), 1)
}

func TestGetOrLoadManyReloadsMissingScripts(t *testing.T) {
	t.Parallel()
	srv := redistest.PrivateServer(t, "TestGetOrLoadManyReloadsMissingScripts empties the server's script cache")
	rdb := redistest.Client(t, srv.Addr)
	require.NoError(t, rdb.ScriptFlush(t.Context()).Err())
	rounds := redistest.RecordRounds(rdb)
	c := New[product](rdb, WithoutNearCache()) // counts every script the client sends
	keys := names("", 4)
	src := &source{}
	got, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
	require.NoError(t, err)
	assert.Len(t, got, 4)
	assert.Equal(t, int64(4), rdb.Exists(t.Context(), keys...).Val(), "values stored")
	_, loads := rounds.Count("script")
	assert.Equal(t, 2, loads, "SCRIPT LOAD of read-or-lock and commit, once each")
	evalRounds, _ := rounds.Count("evalsha")
	assert.Equal(t, 4, evalRounds, "read-or-lock and commit rounds, each sent again once")
}

func TestGetOrLoadManyInstancesOnOverlappingKeysLoadEachKeyOnce(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	keys := names(p, 40)
	const instances, callers = 4, 3
	src := &source{delay: 50 * time.Millisecond}
	var ev eventCounts
	caches := make([]*Cache[product], instances)
	for i := range caches {
		caches[i] = New[product](redistest.Client(t, redistest.Addr(t)), WithObserver(ev.observe))
		t.Cleanup(func() { caches[i].Close() })
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range instances * callers {
		c := caches[i%instances]
		lo := (i % instances) * 7 // overlapping windows of 19 keys
		mine := keys[lo : lo+19]
		wg.Go(func() {
			<-start
			got, err := c.GetOrLoadMany(t.Context(), mine, src.loadMany)
			assert.NoError(t, err)
			for _, k := range mine {
				assert.Equal(t, product{ID: k, Price: len(k)}, got[k], "caller %d: %q", i, k)
			}
		})
	}
	close(start)
	wg.Wait()
	loaded := 0
	for _, k := range keys[:3*7+19] {
		if src.loads(k) > 0 {
			loaded++
		}
		assert.Equal(t, 1, src.loads(k), "loads of %q", k)
	}
	assert.Equal(t, 40, loaded)
	assert.Equal(t, int64(len(src.callKeys())), ev[EventLoad].Load(), "one EventLoad per loadMany call")
	t.Logf("figures: %d instances x %d callers on 40 keys: %d loadMany calls, %d loads", instances, callers, len(src.callKeys()), loaded)
}

func TestGetOrLoadManySharesItsLoadWithGetOrLoad(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	loadBatchScripts(t, rdb)
	c := New[product](rdb, WithoutNearCache()) // counts every script the client sends
	keys := names(p, 5)
	src := &source{entered: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
		done <- err
	}()
	<-src.entered
	rounds := redistest.RecordRounds(rdb)

	single := &counter{}
	var wg sync.WaitGroup
	vals := make([]product, 20)
	errs := make([]error, 20)
	for i := range vals {
		wg.Go(func() { vals[i], errs[i] = c.GetOrLoad(t.Context(), keys[2], single.load) })
	}
	time.Sleep(200 * time.Millisecond) // let them join (a loose bound: a caller that starts after the commit reads Redis)
	close(src.release)
	wg.Wait()
	require.NoError(t, <-done)

	for i := range vals {
		require.NoError(t, errs[i])
		assert.Equal(t, product{ID: keys[2], Price: len(keys[2])}, vals[i])
	}
	assert.Zero(t, single.calls.Load(), "GetOrLoad of a key the batch loads must not load it")
	_, gets := rounds.Count("get")
	_, scripts := rounds.Count("evalsha")
	assert.Equal(t, 0, gets, "GetOrLoad callers joined the batch's flight: no GET of theirs")
	assert.Equal(t, 5, scripts, "only the batch's commits")
}

func TestGetOrLoadManyWaitsForAGetOrLoadThatHoldsTheLock(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb)
	other := New[product](redistest.Client(t, redistest.Addr(t))) // another process
	keys := names(p, 4)
	entered, release := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = other.GetOrLoad(t.Context(), keys[1], func(context.Context) (product, error) {
			close(entered)
			<-release
			return product{ID: "other"}, nil
		})
	}()
	<-entered
	src := &source{}
	time.AfterFunc(100*time.Millisecond, func() { close(release) })
	got, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
	require.NoError(t, err)
	assert.Equal(t, "other", got[keys[1]].ID, "the holder's value")
	assert.Zero(t, src.loads(keys[1]), "a key another process loads is waited for")
	require.Len(t, src.callKeys(), 1)
	assert.ElementsMatch(t, []string{keys[0], keys[2], keys[3]}, src.callKeys()[0])
}

func TestGetOrLoadManyLoaderErrorReleasesLocks(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb)
	keys := names(p, 3)
	require.NoError(t, c.Set(t.Context(), keys[0], product{ID: "warm"}))
	boom := errors.New("database down")
	var calls atomic.Int64
	failing := func(context.Context, []string) (map[string]product, error) {
		calls.Add(1)
		return nil, boom
	}
	got, err := c.GetOrLoadMany(t.Context(), keys, failing)
	require.ErrorIs(t, err, boom)
	assert.Contains(t, err.Error(), strconv.Quote(keys[1]))
	assert.Contains(t, err.Error(), strconv.Quote(keys[2]))
	assert.Equal(t, map[string]product{keys[0]: {ID: "warm"}}, got, "what succeeded is returned")
	for _, k := range keys[1:] {
		assert.Zero(t, rdb.Exists(t.Context(), k, LockKey(k)).Val(), "%q: value or lock left after a loader error", k)
	}
	_, err = c.GetOrLoadMany(t.Context(), keys, failing)
	require.ErrorIs(t, err, boom)
	assert.Equal(t, int64(2), calls.Load(), "a loader error must not be cached")
}

func TestGetOrLoadManyLeftOutKeyIsNotFound(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	keys := names(p, 3)
	for _, tc := range []struct {
		name    string
		opts    []Option
		cached  bool
		reloads int
	}{
		{"cached for the not-found TTL", nil, true, 1},
		{"not-found TTL 0: not cached", []Option{WithNotFoundTTL(0)}, false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { rdb.Del(context.Background(), keys...) })
			c := New[product](rdb, tc.opts...)
			src := &source{absent: map[string]bool{keys[1]: true}}
			for range 2 {
				got, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
				require.NoError(t, err, "a not-found is no error")
				assert.Len(t, got, 2)
				assert.NotContains(t, got, keys[1])
			}
			assert.Equal(t, 1, src.loads(keys[0]))
			assert.Equal(t, tc.reloads, src.loads(keys[1]))
			assert.Zero(t, rdb.Exists(t.Context(), LockKey(keys[1])).Val(), "lock left behind")
			raw, err := rdb.Get(t.Context(), keys[1]).Bytes()
			if !tc.cached {
				assert.ErrorIs(t, err, redis.Nil)
				return
			}
			require.NoError(t, err)
			flags, _, err := record.Decode(raw)
			require.NoError(t, err)
			assert.NotZero(t, flags&record.FlagNotFound, "stored as a not-found record")
			_, err = c.GetOrLoad(t.Context(), keys[1], (&counter{}).load)
			assert.ErrorIs(t, err, ErrNotFound, "GetOrLoad sees the batch's not-found")
		})
	}
}

func TestGetOrLoadManyLoaderPanic(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb)
	keys := names(p, 3)
	src := &source{entered: make(chan struct{}), release: make(chan struct{})}
	panicking := func(ctx context.Context, keys []string) (map[string]product, error) {
		_, _ = src.loadMany(ctx, keys)
		panic("loader bug")
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.GetOrLoadMany(t.Context(), keys, panicking)
		done <- err
	}()
	<-src.entered
	joined := make(chan error, 1)
	go func() { _, err := c.GetOrLoad(t.Context(), keys[0], (&counter{}).load); joined <- err }()
	time.Sleep(20 * time.Millisecond)
	close(src.release)

	err := <-done
	var pe *PanicError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "loader bug", pe.Value)
	// A GetOrLoad that joined the batch's flight gets the panic too; one
	// that came late loads itself.
	if err := <-joined; err != nil {
		require.ErrorAs(t, err, &pe)
	}
	for _, k := range keys[1:] {
		assert.Zero(t, rdb.Exists(t.Context(), k, LockKey(k)).Val(), "%q: value or lock left after a panic", k)
	}
}

func TestGetOrLoadManyCancelledCallerReturnsPromptly(t *testing.T) {
	// Not parallel: it times the cancelled caller to 300 ms.
	rdb, p := setup(t)
	c := New[product](rdb)
	keys := names(p, 3)
	var loaderCtxErr atomic.Value
	slow := func(ctx context.Context, keys []string) (map[string]product, error) {
		time.Sleep(400 * time.Millisecond)
		loaderCtxErr.Store(fmt.Sprint(ctx.Err()))
		return (&source{}).loadMany(ctx, keys)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	got, err := c.GetOrLoadMany(ctx, keys, slow)
	elapsed := time.Since(start)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Nil(t, got)
	assert.Less(t, elapsed, 300*time.Millisecond, "a cancelled caller must not wait for the load")
	waitFor(t, func() bool { return rdb.Exists(t.Context(), keys...).Val() == 3 })
	assert.Equal(t, "<nil>", loaderCtxErr.Load(), "the loader's context must not be cancelled by the caller")
}

func TestGetOrLoadManyDeleteDuringLoadWins(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	var ev eventCounts
	c := New[product](rdb, WithObserver(ev.observe))
	keys := names(p, 3)
	src := &source{entered: make(chan struct{}), release: make(chan struct{})}
	done := make(chan map[string]product, 1)
	go func() {
		got, err := c.GetOrLoadMany(context.Background(), keys, src.loadMany)
		assert.NoError(t, err)
		done <- got
	}()
	<-src.entered
	require.NoError(t, c.Delete(t.Context(), keys[1]))
	close(src.release)
	got := <-done
	assert.Len(t, got, 3, "the caller still gets what it loaded")
	assert.Zero(t, rdb.Exists(t.Context(), keys[1], LockKey(keys[1])).Val(), "a load that began before Delete must not write")
	assert.Equal(t, int64(2), rdb.Exists(t.Context(), keys[0], keys[2]).Val(), "the other keys are stored")
	assert.Equal(t, int64(1), ev[EventLoadVoided].Load(), "the Delete voided the load")
	assert.Zero(t, ev[EventLockLost].Load(), "a write winning is not a lost lock")
}

func TestGetOrLoadManyLoaderOptionsApplyToTheBatch(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	keys := names(p, 2)
	c := New[product](rdb, WithTTL(time.Minute), WithoutJitter(), WithEarlyRefresh(0))
	_, err := c.GetOrLoadMany(t.Context(), keys, func(ctx context.Context, ks []string) (map[string]product, error) {
		SetTTL(ctx, time.Hour)
		return (&source{}).loadMany(ctx, ks)
	})
	require.NoError(t, err)
	for _, k := range keys {
		assert.Greater(t, rdb.PTTL(t.Context(), k).Val(), 59*time.Minute, "SetTTL applies to %q", k)
	}
	more := names(p+"nc:", 2)
	got, err := c.GetOrLoadMany(t.Context(), more, func(ctx context.Context, ks []string) (map[string]product, error) {
		DoNotCache(ctx)
		return (&source{}).loadMany(ctx, ks)
	})
	require.NoError(t, err)
	assert.Len(t, got, 2)
	for _, k := range more {
		assert.Zero(t, rdb.Exists(t.Context(), k, LockKey(k)).Val(), "DoNotCache: %q stored or its lock left", k)
	}
}

func TestGetOrLoadManyServesStaleAndRefreshesOneKey(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	var ev eventCounts
	c := New[product](rdb, WithTTL(50*time.Millisecond), WithoutJitter(), WithEarlyRefresh(0),
		WithStale(time.Minute), WithObserver(ev.observe))
	keys := names(p, 3)
	src := &source{}
	_, err := c.GetOrLoadMany(t.Context(), keys[:1], src.loadMany)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond) // past the TTL

	var info ResultInfo
	got, err := c.GetOrLoadMany(WithResultInfo(t.Context(), &info), keys, src.loadMany)
	require.NoError(t, err)
	assert.Len(t, got, 3)
	assert.True(t, info.Stale, "the caller can tell a value was stale")
	require.NoError(t, c.Close()) // waits for the refresh
	calls := src.callKeys()
	require.Len(t, calls, 3, "the first load, the batch's load of the cold keys, the refresh")
	later := calls[1:] // the refresh runs in the background: either may come first
	slices.SortFunc(later, func(a, b []string) int { return len(a) - len(b) })
	assert.Equal(t, []string{keys[0]}, later[0], "the stale key is refreshed alone, in the background")
	assert.ElementsMatch(t, keys[1:], later[1], "the batch loads only the cold keys")
	assert.Equal(t, int64(1), ev[EventStaleServed].Load())
	assert.Equal(t, int64(1), ev[EventRefresh].Load())
}

func TestGetOrLoadManyWaitsForStaleRefreshesOnce(t *testing.T) {
	// Not parallel: it times the batch to 500 ms.
	rdb, p := setup(t)
	const soft = 100 * time.Millisecond
	c := New[product](rdb, WithTTL(50*time.Millisecond), WithoutJitter(), WithEarlyRefresh(0),
		WithStale(time.Minute), WithSoftLoadTimeout(soft))
	keys := names(p, 10)
	_, err := c.GetOrLoadMany(t.Context(), keys, (&source{}).loadMany)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond) // past the TTL

	release := make(chan struct{})
	slowRefresh := &source{release: release}
	start := time.Now()
	got, err := c.GetOrLoadMany(t.Context(), keys, slowRefresh.loadMany)
	elapsed := time.Since(start)
	close(release)
	require.NoError(t, err)
	assert.Len(t, got, 10, "the stale values")
	require.NoError(t, c.Close())
	require.Len(t, slowRefresh.callKeys(), 1, "one refresh call for the batch's stale keys")
	assert.ElementsMatch(t, keys, slowRefresh.callKeys()[0])
	// Waiting for the refreshes one key after another would take 10 soft
	// timeouts; a loose bound well under that.
	assert.Less(t, elapsed, 5*soft, "stale keys must wait for their refreshes together")
}

// lostLockReplies runs pipelines and then reports a network error in place
// of the replies to the read-or-lock script: the locks were taken, the
// client does not know it.
type lostLockReplies struct{}

func (lostLockReplies) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (lostLockReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (lostLockReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if args := cmd.Args(); cmd.Name() == "evalsha" && args[1] == readOrLockScript.Hash() {
				err = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("reply lost")}
				cmd.SetErr(err)
			}
		}
		return err
	}
}

func TestGetOrLoadManyLostLockRepliesFailOpen(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	loadBatchScripts(t, rdb)
	rdb.AddHook(lostLockReplies{})
	var hooked atomic.Int64
	c := New[product](rdb, WithLockTTL(time.Minute), WithErrorHook(func(string, error) { hooked.Add(1) }))
	keys := names(p, 3)
	src := &source{}
	got, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
	require.NoError(t, err, "FailOpen: the keys are loaded without Redis")
	assert.Len(t, got, 3)
	require.Len(t, src.callKeys(), 1, "one loadMany call")
	assert.ElementsMatch(t, keys, src.callKeys()[0])
	assert.Equal(t, int64(3), hooked.Load(), "each key's Redis error goes to the error hook")
	for _, k := range keys {
		waitFor(t, func() bool { return rdb.Exists(t.Context(), LockKey(k)).Val() == 0 }) // released in the background
		assert.Zero(t, rdb.Exists(t.Context(), k).Val(), "%q: a load without the lock must not be cached", k)
	}
}

func TestGetOrLoadManyInput(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	// It counts rounds with a hook added to a client in use (a race with the
	// near cache's lease renewals on go-redis v9.5.5).
	c := New[product](rdb, WithPrefix(p), WithoutNearCache())
	src := &source{}
	_, err := c.GetOrLoadMany(t.Context(), []string{"a", ""}, src.loadMany)
	assert.ErrorIs(t, err, ErrEmptyKey)
	_, err = c.GetOrLoadMany(t.Context(), []string{"a"}, nil)
	assert.ErrorIs(t, err, ErrNilLoader)
	_, err = New[product](rdb, WithoutNearCache()).GetOrLoadMany(t.Context(), []string{p + "a", LockKey(p + "a")}, src.loadMany)
	assert.ErrorIs(t, err, ErrReservedKey)
	rounds := redistest.RecordRounds(rdb)
	got, err := c.GetOrLoadMany(t.Context(), nil, src.loadMany)
	require.NoError(t, err)
	assert.NotNil(t, got)
	assert.Zero(t, rounds.Total(), "no keys: no Redis call")
	assert.Empty(t, src.callKeys())

	// Duplicates are read and loaded once; keys are the caller's, without
	// the prefix.
	rounds.Reset()
	got, err = c.GetOrLoadMany(t.Context(), []string{"a", "b", "a"}, src.loadMany)
	require.NoError(t, err)
	assert.Equal(t, map[string]product{"a": {ID: "a", Price: 1}, "b": {ID: "b", Price: 1}}, got)
	require.Len(t, src.callKeys(), 1)
	assert.ElementsMatch(t, []string{"a", "b"}, src.callKeys()[0])
	_, gets := rounds.Count("get")
	assert.Equal(t, 2, gets, "GETs for two distinct keys")
	assert.Equal(t, int64(1), rdb.Exists(t.Context(), p+"a").Val(), "stored under the prefix")
}

func TestGetOrLoadManyRedisDown(t *testing.T) {
	t.Parallel()
	dead := redis.NewClient(&redis.Options{Addr: deadAddr(t), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { dead.Close() })
	t.Run("fail open loads every key once, uncached", func(t *testing.T) {
		c := New[product](dead)
		src := &source{absent: map[string]bool{"b": true}}
		got, err := c.GetOrLoadMany(t.Context(), []string{"a", "b", "c"}, src.loadMany)
		require.NoError(t, err)
		assert.Equal(t, map[string]product{"a": {ID: "a", Price: 1}, "c": {ID: "c", Price: 1}}, got)
		require.Len(t, src.callKeys(), 1)
		assert.ElementsMatch(t, []string{"a", "b", "c"}, src.callKeys()[0])
	})
	t.Run("fail closed returns the Redis error for each key", func(t *testing.T) {
		c := New[product](dead, WithFailurePolicy(FailClosed))
		src := &source{}
		got, err := c.GetOrLoadMany(t.Context(), []string{"a", "b"}, src.loadMany)
		require.Error(t, err)
		assert.Empty(t, got)
		assert.Contains(t, err.Error(), `"a"`)
		assert.Contains(t, err.Error(), `"b"`)
		assert.Contains(t, err.Error(), "cache: redis")
		assert.Empty(t, src.callKeys())
	})
	t.Run("open breaker under fail closed", func(t *testing.T) {
		c := New[product](dead, WithFailurePolicy(FailClosed), WithCircuitBreaker(1, time.Hour))
		_, _ = c.GetOrLoadMany(t.Context(), []string{"a"}, (&source{}).loadMany)
		_, err := c.GetOrLoadMany(t.Context(), []string{"a", "b"}, (&source{}).loadMany)
		assert.ErrorIs(t, err, ErrCircuitOpen)
	})
}

// BenchmarkGetOrLoadMany reads 100 keys of which 10 are cold, with one
// GetOrLoadMany and with 100 GetOrLoad calls in parallel, and reports the
// Redis round trips and loader calls per batch.
func BenchmarkGetOrLoadMany(b *testing.B) {
	rdb := redistest.Client(b, redistest.Addr(b))
	loadBatchScripts(b, rdb)
	rounds := redistest.RecordRounds(rdb)
	const n, cold = 100, 10
	c := New[product](rdb, WithoutJitter())
	p := "bench:batch:" + token.NewToken() + ":"
	keys := names(p, n)
	b.Cleanup(func() { redistest.DeletePrefix(rdb, p) })
	warm := func(b *testing.B) {
		b.StopTimer()
		defer b.StartTimer()
		require.NoError(b, c.Delete(context.Background(), keys[:cold]...))
		for _, k := range keys[cold:] {
			require.NoError(b, c.Set(context.Background(), k, product{ID: k}))
		}
		rounds.Reset()
	}
	report := func(b *testing.B, loads int64, rt int) {
		b.ReportMetric(float64(rt)/float64(b.N), "round-trips/op")
		b.ReportMetric(float64(loads)/float64(b.N), "loader-calls/op")
	}
	b.Run("keys=100/cold=10/GetOrLoadMany", func(b *testing.B) {
		b.ReportAllocs()
		var loads int64
		rt := 0
		for b.Loop() {
			warm(b)
			_, err := c.GetOrLoadMany(context.Background(), keys, func(ctx context.Context, ks []string) (map[string]product, error) {
				loads++
				return (&source{}).loadMany(ctx, ks)
			})
			if err != nil {
				b.Fatal(err)
			}
			rt += rounds.Total()
		}
		report(b, loads, rt)
	})
	b.Run("keys=100/cold=10/GetOrLoad-parallel", func(b *testing.B) {
		b.ReportAllocs()
		var loads atomic.Int64
		rt := 0
		for b.Loop() {
			warm(b)
			var wg sync.WaitGroup
			for _, k := range keys {
				wg.Go(func() {
					_, err := c.GetOrLoad(context.Background(), k, func(context.Context) (product, error) {
						loads.Add(1)
						return product{ID: k}, nil
					})
					if err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
			rt += rounds.Total()
		}
		report(b, loads.Load(), rt)
	})
}

func TestGetOrLoadManyDoNotCacheIsSharedWithMergedCallers(t *testing.T) {
	t.Parallel()
	// GetOrLoad callers that join a batch's DoNotCache load of their key
	// get its value instead of loading it again.
	rdb, p := setup(t)
	c := New[product](rdb)
	key := p + "k"
	loading, release := make(chan struct{}), make(chan struct{})
	batch := make(chan error, 1)
	go func() {
		_, err := c.GetOrLoadMany(context.Background(), []string{key}, func(ctx context.Context, ks []string) (map[string]product, error) {
			close(loading)
			<-release
			DoNotCache(ctx)
			return map[string]product{key: {ID: "v"}}, nil
		})
		batch <- err
	}()
	<-loading
	var loads atomic.Int64
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			v, err := c.GetOrLoad(t.Context(), key, func(context.Context) (product, error) {
				loads.Add(1)
				return product{ID: "again"}, nil
			})
			if assert.NoError(t, err) {
				assert.Equal(t, "v", v.ID)
			}
		})
	}
	time.Sleep(50 * time.Millisecond) // the 20 join the batch's flight
	close(release)
	wg.Wait()
	require.NoError(t, <-batch)
	if got := loads.Load(); got != 0 {
		t.Fatalf("20 callers merged with a batch's DoNotCache load loaded %d more times; want 0", got)
	}
}

// sizes returns the number of keys of each of src's calls, in order.
func (s *source) sizes() []int {
	var n []int
	for _, c := range s.callKeys() {
		n = append(n, len(c))
	}
	return n
}

// refreshEvents records the errors of EventRefresh and counts the events.
type refreshEvents struct {
	eventCounts
	mu   sync.Mutex // protects errs
	errs []error
}

func (e *refreshEvents) observe(ev Event) {
	e.eventCounts.observe(ev)
	if ev.Kind == EventRefresh && ev.Err != nil {
		e.mu.Lock()
		e.errs = append(e.errs, ev.Err)
		e.mu.Unlock()
	}
}

// TestGetOrLoadManyRefreshesAStalePageInOneCall: a 20-key page past its TTL
// is served stale and refreshed by one loadMany call of 20 keys, not 20
// calls of one; with a soft load timeout the batch waits for
// that one call and serves its fresh values.
func TestGetOrLoadManyRefreshesAStalePageInOneCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		soft      time.Duration
		wantStale bool
	}{
		{"stale served, refreshed in the background", 0, true},
		{"soft load timeout: the refreshed values", 5 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, p := setup(t)
			var ev eventCounts
			const ttl = 300 * time.Millisecond
			c := New[product](rdb, WithTTL(ttl), WithoutJitter(), WithEarlyRefresh(0),
				WithStale(time.Minute), WithSoftLoadTimeout(tc.soft), WithObserver(ev.observe))
			keys := names(p, 20)
			src := &source{}
			_, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
			require.NoError(t, err)
			time.Sleep(ttl + 100*time.Millisecond) // past the TTL

			var info ResultInfo
			refreshFrom := time.Now()
			got, err := c.GetOrLoadMany(WithResultInfo(t.Context(), &info), keys, src.loadMany)
			require.NoError(t, err)
			assert.Len(t, got, 20)
			assert.Equal(t, tc.wantStale, info.Stale)
			require.NoError(t, c.Close()) // waits for the refresh
			assert.Equal(t, []int{20, 20}, src.sizes(), "loadMany call sizes: the load, then one refresh of the page")
			assert.ElementsMatch(t, keys, src.callKeys()[1])
			assert.Equal(t, int64(20), ev[EventRefresh].Load())
			wantServed := int64(20)
			if !tc.wantStale {
				wantServed = 0
			}
			assert.Equal(t, wantServed, ev[EventStaleServed].Load())
			for _, k := range keys {
				assert.Zero(t, rdb.Exists(t.Context(), LockKey(k)).Val(), "%q: refresh lock left", k)
			}

			// The refresh stored fresh values: each record's expiry is past
			// the start of the call that refreshed it (read from the records,
			// not through a Cache, which a loaded machine may reach only
			// once they expired again).
			for _, k := range keys {
				raw, err := rdb.Get(t.Context(), k).Bytes()
				require.NoError(t, err)
				f, ok := record.ReadFreshness(raw)
				require.True(t, ok, "%q: no freshness in the record", k)
				assert.True(t, f.Expiry.After(refreshFrom), "%q: the refresh stored no fresh value (expiry %v, refresh from %v)", k, f.Expiry, refreshFrom)
			}
		})
	}
}

// TestGetOrLoadManyEarlyRefreshIsOneCall: a page due for early refresh
// (on by default) is refreshed by one loadMany call.
func TestGetOrLoadManyEarlyRefreshIsOneCall(t *testing.T) {
	// Not parallel: the second read must come within 200 ms of its sleep, before the TTL ends.
	rdb, p := setup(t)
	var ev eventCounts
	c := New[product](rdb, WithTTL(500*time.Millisecond), WithoutJitter(), WithObserver(ev.observe))
	keys := names(p, 20)
	src := &source{delay: 300 * time.Millisecond}
	_, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
	require.NoError(t, err)
	// Due: within one load duration (300 ms) of the expiry, whatever the draw.
	time.Sleep(300 * time.Millisecond)

	got, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
	require.NoError(t, err)
	assert.Len(t, got, 20)
	require.NoError(t, c.Close())
	assert.Equal(t, []int{20, 20}, src.sizes(), "loadMany call sizes: the load, then one early refresh of the page")
	assert.Equal(t, int64(20), ev[EventRefresh].Load())
	assert.Equal(t, int64(20), ev[EventMiss].Load(), "only the cold reads missed")
	assert.Greater(t, rdb.PTTL(t.Context(), keys[0]).Val(), 300*time.Millisecond, "the refresh stored the value for a new TTL")
}

// TestGetOrLoadManyRefreshLeavesKeysLockedElsewhere: another process (a
// Cache on its own client) is refreshing 5 keys of a stale page; the batch
// serves them as they are and refreshes the other 15 in one call.
func TestGetOrLoadManyRefreshLeavesKeysLockedElsewhere(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	opts := []Option{WithTTL(50 * time.Millisecond), WithoutJitter(), WithEarlyRefresh(0), WithStale(time.Minute)}
	var ev eventCounts
	c := New[product](rdb, append(opts, WithObserver(ev.observe))...)
	other := New[product](redistest.Client(t, redistest.Addr(t)), opts...)
	keys := names(p, 20)
	src := &source{}
	_, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond) // past the TTL

	release := make(chan struct{})
	var entered atomic.Int64
	slow := func(ctx context.Context) (product, error) {
		entered.Add(1)
		<-release
		return product{ID: "other"}, nil
	}
	for _, k := range keys[:5] {
		_, err := other.GetOrLoad(t.Context(), k, slow) // stale: served, its refresh holds the lock
		require.NoError(t, err)
	}
	waitFor(t, func() bool { return entered.Load() == 5 })

	got, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
	require.NoError(t, err)
	assert.Len(t, got, 20, "the keys locked elsewhere are served as they are")
	require.NoError(t, c.Close())
	close(release)
	require.NoError(t, other.Close())
	assert.Equal(t, []int{20, 15}, src.sizes(), "loadMany call sizes: the load, then one refresh of the keys not locked elsewhere")
	assert.ElementsMatch(t, keys[5:], src.callKeys()[1])
	assert.Equal(t, int64(15), ev[EventRefresh].Load())
	assert.Equal(t, int64(20), ev[EventStaleServed].Load())
}

// TestGetOrLoadManyRefreshIsSharedWithGetOrLoad: a GetOrLoad of a key
// while the batch's refresh of it runs serves the value without a load of
// its own.
func TestGetOrLoadManyRefreshIsSharedWithGetOrLoad(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithTTL(50*time.Millisecond), WithoutJitter(), WithEarlyRefresh(0), WithStale(time.Minute))
	keys := names(p, 20)
	_, err := c.GetOrLoadMany(t.Context(), keys, (&source{}).loadMany)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond) // past the TTL

	src := &source{entered: make(chan struct{}), release: make(chan struct{})}
	got, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
	require.NoError(t, err)
	assert.Len(t, got, 20)
	<-src.entered
	single := &counter{}
	v, err := c.GetOrLoad(t.Context(), keys[3], single.load)
	require.NoError(t, err)
	assert.Equal(t, keys[3], v.ID, "the stale value, while the batch refreshes it")
	close(src.release)
	require.NoError(t, c.Close())
	assert.Zero(t, single.calls.Load(), "GetOrLoad loaded a key the batch was refreshing")
	assert.Equal(t, []int{20}, src.sizes(), "loadMany call sizes of the refresh")
}

// TestGetOrLoadManyRefreshPanic: a loadMany that panics in the batch's
// refresh crashes nothing: the stale values are served, every key's
// EventRefresh carries the *PanicError, and the old values are kept for the
// throttle (stale-if-error), no lock left behind.
func TestGetOrLoadManyRefreshPanic(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	var ev refreshEvents
	var hooked atomic.Int64
	c := New[product](rdb, WithTTL(50*time.Millisecond), WithoutJitter(), WithEarlyRefresh(0),
		WithStale(time.Minute), WithObserver(ev.observe), WithErrorHook(func(string, error) { hooked.Add(1) }))
	keys := names(p, 20)
	src := &source{}
	_, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond) // past the TTL

	var mu sync.Mutex // protects calls
	var calls [][]string
	panics := func(ctx context.Context, ks []string) (map[string]product, error) {
		mu.Lock()
		calls = append(calls, slices.Clone(ks))
		mu.Unlock()
		panic("database driver broke")
	}
	got, err := c.GetOrLoadMany(t.Context(), keys, panics)
	require.NoError(t, err, "the stale values are served")
	assert.Len(t, got, 20)
	require.NoError(t, c.Close())
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, 1, "one refresh call for the page")
	assert.Len(t, calls[0], 20)
	require.Len(t, ev.errs, 20, "an EventRefresh with the error per key")
	for _, err := range ev.errs {
		var pe *PanicError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "database driver broke", pe.Value)
	}
	assert.Equal(t, int64(20), hooked.Load(), "each failed refresh goes to the error hook")
	for _, k := range keys {
		assert.Zero(t, rdb.Exists(t.Context(), LockKey(k)).Val(), "%q: refresh lock left", k)
		raw, err := rdb.Get(t.Context(), k).Bytes()
		require.NoError(t, err)
		assert.NotZero(t, raw[1]&record.FlagThrottled, "%q: the old value is kept for the throttle", k)
	}
}

// TestGetOrLoadManyCallOptions: ForceRefresh and NoStale apply to batches
// as to GetOrLoad (they were ignored).
func TestGetOrLoadManyCallOptions(t *testing.T) {
	t.Parallel()
	rdb, p := setup(t)
	c := New[product](rdb, WithTTL(100*time.Millisecond), WithStale(time.Hour), WithoutJitter(), WithoutNearCache())
	keys := names(p, 2)
	src := &source{}
	_, err := c.GetOrLoadMany(t.Context(), keys, src.loadMany)
	require.NoError(t, err)
	require.Len(t, src.callKeys(), 1)

	_, err = c.GetOrLoadMany(t.Context(), keys, src.loadMany, ForceRefresh())
	require.NoError(t, err)
	require.Len(t, src.callKeys(), 2, "ForceRefresh loads cached keys anew")
	assert.ElementsMatch(t, keys, src.callKeys()[1])

	time.Sleep(150 * time.Millisecond) // past the TTL: stale, still served under WithStale
	var info ResultInfo
	_, err = c.GetOrLoadMany(WithResultInfo(t.Context(), &info), keys, src.loadMany, NoStale())
	require.NoError(t, err)
	assert.False(t, info.Stale, "NoStale: no stale value returned")
	calls := src.callKeys()
	require.GreaterOrEqual(t, len(calls), 3, "NoStale loads the stale keys")
	assert.ElementsMatch(t, keys, calls[2])
}

// GetOrLoadMany reads memory and fills it, as GetOrLoad does, with the same
// promise: a value another process Set is never served from memory after
// the Set returned.
func TestGetOrLoadManyReadsAndFillsTheNearCache(t *testing.T) {
	t.Parallel()
	_, p := setup(t)
	c, cmds, ev := newNearCacheCounting(t, p)
	other, _, _ := newNearCache(t, p)
	keys := []string{"a", "b", "c"}
	var loads atomic.Int64
	loadMany := func(_ context.Context, ks []string) (map[string]product, error) {
		loads.Add(1)
		m := map[string]product{}
		for _, k := range ks {
			m[k] = product{ID: k}
		}
		return m, nil
	}
	// Memory keeps a read only once its reply follows the near cache's
	// tracking: read until every key is served from memory.
	require.True(t, eventually(func() bool {
		m, err := c.GetOrLoadMany(t.Context(), keys, loadMany)
		require.NoError(t, err)
		require.Len(t, m, 3)
		hits := ev.get(EventNearHit)
		_, err = c.GetOrLoadMany(t.Context(), keys, loadMany)
		require.NoError(t, err)
		return ev.get(EventNearHit)-hits == 3
	}), "GetOrLoadMany never served the batch from memory")
	gets := cmds.Count("get") + cmds.Count("mget") + cmds.Count("evalsha") + cmds.Count("eval")
	m, err := c.GetOrLoadMany(t.Context(), keys, loadMany)
	require.NoError(t, err)
	assert.Equal(t, "b", m["b"].ID)
	assert.Equal(t, gets, cmds.Count("get")+cmds.Count("mget")+cmds.Count("evalsha")+cmds.Count("eval"), "a batch held in memory still read Redis")
	assert.Equal(t, int64(1), loads.Load())

	require.NoError(t, other.Set(t.Context(), "b", product{ID: "b2"}))
	m, err = c.GetOrLoadMany(t.Context(), keys, loadMany)
	require.NoError(t, err)
	assert.Equal(t, "b2", m["b"].ID, "memory served a value another process's Set replaced")
}
