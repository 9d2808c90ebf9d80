// lock.go is the Redis lock: the load lock GetOrLoad takes, and the same lock
// on its own for other jobs (one instance runs a scheduled job, a repeated
// submission is refused).

package cache

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/release.lua
	releaseLua    string
	releaseScript = redis.NewScript(releaseLua)

	//go:embed scripts/refresh.lua
	refreshLua    string
	refreshScript = redis.NewScript(refreshLua)
)

// Lock is a lease on a Redis key, identified by a random token so that only
// its holder can release or extend it. It is safe for concurrent use.
//
// A Lock is a lease, not a mutex: if the holder stalls past the TTL without
// refreshing, another process may take it. Code that writes shared state under
// the lock must fence its writes (as [Cache.GetOrLoad] does with its commit).
// On a replicated Redis, a failover can lose a lock that was not yet copied to
// the replica.
type Lock struct {
	rdb   redis.Scripter
	key   string
	token string
}

// Obtain takes the lock at key (after [WithPrefix]) for the lease set by
// [WithLockTTL] (default 5s). If another holder has it, Obtain retries as
// [WithRetry] says (default 60 retries, 100ms apart), then returns
// [ErrLockNotAcquired], joined with ctx.Err() when ctx ended the wait. Other
// options are ignored. Invalid options panic, as in [New].
func Obtain(ctx context.Context, rdb redis.UniversalClient, key string, opts ...Option) (*Lock, error) {
	if key == "" {
		return nil, ErrEmptyKey
	}
	cfg := newConfig(opts)
	l := &Lock{rdb: rdb, key: cfg.prefix + key, token: newToken()}
	for attempt := 1; ; attempt++ {
		ok, err := rdb.SetNX(ctx, l.key, l.token, cfg.lockTTL).Result()
		if err != nil {
			return nil, err
		}
		if ok {
			return l, nil
		}
		if !cfg.retry.wait(ctx, attempt) {
			return nil, notAcquired(ctx)
		}
	}
}

// Key is the Redis key of the lock.
func (l *Lock) Key() string { return l.key }

// Token is the random value that identifies this holder; it is what the lock
// key holds while the lock is ours.
func (l *Lock) Token() string { return l.token }

// Release deletes the lock if it is still ours; otherwise it returns
// [ErrLockNotHeld] and changes nothing.
func (l *Lock) Release(ctx context.Context) error {
	return ownerChecked(releaseScript.Run(ctx, l.rdb, []string{l.key}, l.token))
}

// Refresh extends the lease to ttl from now if the lock is still ours;
// otherwise it returns [ErrLockNotHeld] and changes nothing.
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl < time.Millisecond {
		return errors.New("cache: Refresh: ttl must be at least 1ms")
	}
	return ownerChecked(refreshScript.Run(ctx, l.rdb, []string{l.key}, l.token, ttl.Milliseconds()))
}

func ownerChecked(cmd *redis.Cmd) error {
	n, err := cmd.Int()
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrLockNotHeld
	}
	return nil
}

// newToken returns 128 random bits, hex-encoded.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+): it crashes the program instead.
	return hex.EncodeToString(b[:])
}

