// This file shows the standalone lock on the jobs it is for: one
// worker per customer, one instance per cron run, a repeated submission
// refused, an oversell prevented, a stalled holder's write fenced off,
// Redlock; then the lease by hand (Refresh, Release), an observer of the
// lock's events, and the retry strategies (an acquire timeout). They run in CI, their Output checked,
// against the test Redis, whose address TestMain puts in REDIS_ADDR.

package lock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/lock"
)

// A sync service runs on several instances; each customer must be synced by
// one instance at a time, and an instance that finds a customer taken skips
// it. Do renews the 15s lease every 5s while the sync runs, cancels the
// sync's context if the lease is lost, and releases the lock at the end.
func ExampleDo() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	const key = "example:sync:customer:42"

	// Instance A takes customer 42.
	err := lock.Do(ctx, rdb, key, 15*time.Second, func(ctx context.Context) error {
		fmt.Println("instance A syncs customer 42")
		// ... call the CRM with ctx: it is cancelled if the lock is lost.

		// Meanwhile instance B reaches the same customer.
		err := lock.Do(ctx, rdb, key, 15*time.Second, func(ctx context.Context) error {
			fmt.Println("instance B syncs customer 42")
			return nil
		})
		if errors.Is(err, lock.ErrNotObtained) {
			fmt.Println("instance B skips customer 42: another instance has it")
		}
		return nil
	})
	if err != nil {
		fmt.Println("sync failed:", err)
	}
	// Output:
	// instance A syncs customer 42
	// instance B skips customer 42: another instance has it
}

// Every instance runs the same schedule; each run of the nightly report must
// happen once. The lock is named after the run and is not released when the
// report is done: its lease keeps instances whose clocks or schedulers lag
// from running the same report again. Hold renews the lease while the report
// runs, however long it takes.
func ExampleLock_Hold() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()

	run := time.Date(2026, 11, 22, 2, 0, 0, 0, time.UTC) // the run the scheduler fired
	key := "example:cron:nightly-report:" + run.Format(time.RFC3339)
	defer rdb.Del(ctx, key) // for the example only: let it run again

	for _, instance := range []string{"instance-a", "instance-b"} {
		l, err := lock.Obtain(ctx, rdb, key, 10*time.Minute, lock.WithMetadata(instance))
		if errors.Is(err, lock.ErrNotObtained) {
			fmt.Println(instance, "skips: this run is taken")
			continue
		}
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		err = l.Hold(ctx, func(ctx context.Context) error {
			fmt.Println(instance, "runs the report for", run.Format("2006-01-02"))
			return nil
		})
		if err != nil {
			fmt.Println("report failed:", err)
		}
	}
	// Output:
	// instance-a runs the report for 2026-11-22
	// instance-b skips: this run is taken
}

// A user double-clicks "submit": the second request within 2s is refused.
// The lock is never released; it expires.
func ExampleObtain() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	defer rdb.Del(ctx, "example:submit:user42:order-form") // for the example only

	submit := func() string {
		_, err := lock.Obtain(ctx, rdb, "example:submit:user42:order-form", 2*time.Second)
		switch {
		case errors.Is(err, lock.ErrNotObtained):
			return "refused: already submitted"
		case err != nil:
			return "error: " + err.Error()
		}
		return "accepted"
	}
	fmt.Println(submit())
	fmt.Println(submit())
	// Output:
	// accepted
	// refused: already submitted
}

// Ten buyers race for the last three items. Each reads and decrements the
// stock under the lock, waiting for it with jittered backoff, so no item is
// sold twice. The write uses the context Do gives, so it is not sent once
// the lease is known to be lost; only a store that checks the lock's fence
// (see ExampleLock_Fence) or a version stops a holder that stalled past
// its lease.
func ExampleObtain_oversell() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	const stock = "example:stock:sku-1"
	rdb.Set(ctx, stock, 3, 0)
	defer rdb.Del(ctx, stock)

	retry := lock.WithRetry(lock.LimitRetry(lock.ExponentialBackoff(2*time.Millisecond, 50*time.Millisecond), 200))
	var sold, refused atomic.Int64
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			err := lock.Do(ctx, rdb, "example:lock:sku-1", 5*time.Second, func(ctx context.Context) error {
				left, err := rdb.Get(ctx, stock).Int()
				if err != nil {
					return err
				}
				if left == 0 {
					refused.Add(1)
					return nil
				}
				sold.Add(1)
				return rdb.Set(ctx, stock, left-1, 0).Err()
			}, retry)
			if err != nil {
				fmt.Println("error:", err)
			}
		})
	}
	wg.Wait()
	fmt.Println("sold", sold.Load(), "refused", refused.Load(), "left", rdb.Get(ctx, stock).Val())
	// Output: sold 3 refused 7 left 0
}

// stockStore is a stock table, stock(sku, qty, fence), that keeps with each
// row the fence of the last write it accepted: an in-process stand-in for a
// SQL database. It is safe for concurrent use.
type stockStore struct {
	mu   sync.Mutex // protects rows
	rows map[string]stockRow
}

type stockRow struct{ qty, fence int64 }

// Qty reads the row: SELECT qty FROM stock WHERE sku = $1.
func (s *stockStore) Qty(sku string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rows[sku].qty
}

// SetQty writes the row if fence is above the last fence written to it, and
// reports whether it did, in one atomic step:
//
//	UPDATE stock SET qty = $2, fence = $1 WHERE sku = $3 AND fence < $1
func (s *stockStore) SetQty(fence, qty int64, sku string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rows[sku]
	if !ok || r.fence >= fence {
		return false
	}
	s.rows[sku] = stockRow{qty: qty, fence: fence}
	return true
}

// Buyer A takes the lock on the last three items, reads the stock and
// stalls (a GC pause, a frozen VM) past its lease. Buyer B takes the lock
// then, sells one, and writes. When A wakes up it writes what it computed
// from its stale read: without a fence both sales would land on one item
// (qty 2 after two sales, an oversell); the store refuses A's write because
// B's fence is larger, and A knows its sale did not happen.
func ExampleLock_Fence() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	const key = "example:lock:stock:sku-2"
	store := &stockStore{rows: map[string]stockRow{"sku-2": {qty: 3}}}

	a, err := lock.Obtain(ctx, rdb, key, 100*time.Millisecond)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	defer rdb.Del(ctx, key, a.FenceKey()) // for the example only: keep the counter in production
	seenByA := store.Qty("sku-2")
	time.Sleep(200 * time.Millisecond) // A stalls; its lease runs out

	b, err := lock.Obtain(ctx, rdb, key, 5*time.Second)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println("B's fence is larger than A's:", b.Fence() > a.Fence())
	fmt.Println("B sells one:", store.SetQty(b.Fence(), store.Qty("sku-2")-1, "sku-2"))
	_ = b.Release(ctx)

	if !store.SetQty(a.Fence(), seenByA-1, "sku-2") {
		fmt.Println("A's write refused: a later holder wrote; A cancels its sale")
	}
	fmt.Println("left:", store.Qty("sku-2"))
	// Output:
	// B's fence is larger than A's: true
	// B sells one: true
	// A's write refused: a later holder wrote; A cancels its sale
	// left: 2
}

// Redlock over five independent masters: the lock is held when a majority
// granted it. Here the five "masters" are five databases of the test Redis,
// only to make the example runnable; in production they are five separate
// servers on separate machines.
func ExampleObtainQuorum() {
	ctx := context.Background()
	var masters []redis.Scripter
	for db := range 5 {
		c := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR"), DB: db})
		defer c.Close()
		masters = append(masters, c)
	}

	l, err := lock.ObtainQuorum(ctx, masters, "example:redlock:invoice-run", 30*time.Second)
	if err != nil {
		fmt.Println("not acquired:", err)
		return
	}
	defer l.Release(ctx)
	fmt.Println("held on a majority; valid for most of 30s:", l.Validity() > 25*time.Second)
	// Output: held on a majority; valid for most of 30s: true
}

// A job that works in steps renews its lease between them with Refresh
// (Hold does it for you on a timer). Refresh reports ErrNotHeld once the
// lease ran out and someone else could have taken the lock: stop then.
func ExampleLock_Refresh() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	key := uniqueKey("example:refresh:import")
	defer rdb.Del(ctx, key)

	l, err := lock.Obtain(ctx, rdb, key, 10*time.Second)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	for step := 1; step <= 3; step++ {
		// ... import one file ...
		if err := l.Refresh(ctx, 10*time.Second); err != nil {
			fmt.Println("stop:", err)
			return
		}
		fmt.Println("step", step, "done; lease renewed")
	}
	_ = l.Release(ctx)

	// A holder that stalled past its lease finds out on its next Refresh.
	l, err = lock.Obtain(ctx, rdb, key, 50*time.Millisecond)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	time.Sleep(100 * time.Millisecond) // a GC pause, a slow step: the lease runs out
	err = l.Refresh(ctx, 10*time.Second)
	fmt.Println("after a stall:", err, errors.Is(err, lock.ErrNotHeld))
	// Output:
	// step 1 done; lease renewed
	// step 2 done; lease renewed
	// step 3 done; lease renewed
	// after a stall: lock: not held true
}

// Release lets the next instance start at once instead of waiting for the
// lease to run out. It deletes the key only while it holds this holder's
// token: a late Release never frees a lock that someone else took since.
func ExampleLock_Release() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	key := uniqueKey("example:release:export")
	defer rdb.Del(ctx, key)

	a, _ := lock.Obtain(ctx, rdb, key, time.Minute)
	fmt.Println("A releases:", a.Release(ctx))
	b, err := lock.Obtain(ctx, rdb, key, time.Minute)
	fmt.Println("B obtains at once:", err)

	err = a.Release(ctx) // A again, late: B holds the lock now
	fmt.Println("A's late release:", err)
	_, err = b.TTL(ctx)
	fmt.Println("B still holds it:", err == nil)
	fmt.Println("B releases:", b.Release(ctx))
	// Output:
	// A releases: <nil>
	// B obtains at once: <nil>
	// A's late release: lock: not held
	// B still holds it: true
	// B releases: <nil>
}

// An observer hears of each acquisition with the attempts it took, each
// give-up and each loss; here it prints them. (LockObserver in the module
// github.com/stampede-go/stampede/otel records them as OpenTelemetry
// metrics.)
func ExampleWithObserver() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	key := uniqueKey("example:observer:invoice")
	defer rdb.Del(ctx, key)
	show := lock.WithObserver(func(e lock.Event) {
		fmt.Printf("%s: attempts %d, error %v\n", e.Kind, e.Attempts, e.Err != nil)
	})

	a, _ := lock.Obtain(ctx, rdb, key, time.Minute, show)
	retry := lock.WithRetry(lock.LimitRetry(lock.LinearBackoff(time.Millisecond), 2))
	_, _ = lock.Obtain(ctx, rdb, key, time.Minute, show, retry)
	rdb.Del(ctx, key) // A's lease is lost (an operator, an eviction)
	_ = a.Release(ctx)
	// Output:
	// obtained: attempts 1, error false
	// not_obtained: attempts 3, error true
	// lost_at_release: attempts 0, error true
}

// To wait for a lock instead of skipping the work, retry: LinearBackoff
// tries again at a fixed interval. It has no limit of its own; the
// context's deadline is the acquire timeout.
func ExampleLinearBackoff() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	key := uniqueKey("example:linear:report")
	defer rdb.Del(ctx, key)

	holder, _ := lock.Obtain(ctx, rdb, key, time.Minute)
	released := make(chan struct{})
	go func() { // the holder finishes in 50ms
		defer close(released)
		time.Sleep(50 * time.Millisecond)
		_ = holder.Release(ctx)
	}()

	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second) // wait at most 5s
	defer cancel()
	l, err := lock.Obtain(waitCtx, rdb, key, time.Minute, lock.WithRetry(lock.LinearBackoff(10*time.Millisecond)))
	fmt.Println("obtained after the holder released:", err)
	_ = l.Release(ctx)
	<-released

	// A holder that keeps the lock past the timeout: the error says both.
	holder, _ = lock.Obtain(ctx, rdb, key, time.Minute)
	defer holder.Release(ctx)
	waitCtx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = lock.Obtain(waitCtx, rdb, key, time.Minute, lock.WithRetry(lock.LinearBackoff(10*time.Millisecond)))
	fmt.Println("not obtained:", errors.Is(err, lock.ErrNotObtained), errors.Is(err, context.DeadlineExceeded))
	// Output:
	// obtained after the holder released: <nil>
	// not obtained: true true
}

// ExponentialBackoff doubles the wait (with jitter, so that instances that
// failed together do not retry together); LimitRetry bounds the number of
// retries. Each call counts its own retries: one strategy can be shared by
// every goroutine.
func ExampleExponentialBackoff() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	key := uniqueKey("example:exponential:invoice")
	defer rdb.Del(ctx, key)

	// Waits of 1-2ms, 2-4ms, 4-8ms, 8-16ms, 8-16ms: 5 retries, 6 attempts.
	retry := lock.LimitRetry(lock.ExponentialBackoff(2*time.Millisecond, 16*time.Millisecond), 5)
	var waits []string
	for d := range retry.Backoffs() {
		waits = append(waits, fmt.Sprint(d >= time.Millisecond && d <= 16*time.Millisecond))
	}
	fmt.Println("waits within bounds:", waits)

	holder, _ := lock.Obtain(ctx, rdb, key, time.Minute) // held throughout
	defer holder.Release(ctx)
	_, err := lock.Obtain(ctx, rdb, key, time.Minute, lock.WithRetry(retry))
	fmt.Println("gave up:", errors.Is(err, lock.ErrNotObtained))
	// Output:
	// waits within bounds: [true true true true true]
	// gave up: true
}

// RetryFunc makes any schedule a strategy: here three waits fitted to a job
// known to hold the lock for about 50ms, then give up.
func ExampleRetryFunc() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	key := uniqueKey("example:retryfunc:nightly")
	defer rdb.Del(ctx, key)

	schedule := []time.Duration{20 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond}
	retry := lock.RetryFunc(func(n int) (time.Duration, bool) { // n: 1 before the first retry
		if n > len(schedule) {
			return 0, false
		}
		return schedule[n-1], true
	})
	fmt.Println("schedule:", slices.Collect(retry.Backoffs()))

	// The holder's 50ms lease runs out during the waits.
	_, _ = lock.Obtain(ctx, rdb, key, 50*time.Millisecond)
	l, err := lock.Obtain(ctx, rdb, key, time.Minute, lock.WithRetry(retry))
	fmt.Println("obtained:", err)
	_ = l.Release(ctx)
	// Output:
	// schedule: [20ms 50ms 200ms]
	// obtained: <nil>
}

// uniqueKey is name followed by a random suffix: each run of an example
// locks a key of its own, so that runs sharing a Redis never meet. The
// fencing counters it leaves are deleted by TestMain.
func uniqueKey(name string) string {
	return name + ":" + strconv.FormatUint(rand.Uint64(), 36)
}
