// loadlock.go is the load lock GetOrLoad takes on a miss. Every script that
// touches it names the value key first, so that a redis.Ring (which routes a
// script by its first key) keeps the value and its lock on one shard.

package cache

import (
	"context"
	_ "embed"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/token"
)

var (
	//go:embed scripts/unlock.lua
	unlockLua    string
	unlockScript = redis.NewScript(unlockLua)
)

// ownerChecked turns the reply of an owner-checked script (1 done, 0 not
// ours) into nil or [ErrLoadLockLost]; other errors come back unchanged.
func ownerChecked(cmd *redis.Cmd) error {
	owned, err := token.Owned(cmd)
	if err == nil && !owned {
		return ErrLoadLockLost
	}
	return err
}

// loadLock is one attempt's claim on a key's load lock.
type loadLock struct {
	key   string // the value key
	lock  string // LockKey(key)
	token string
}

func newLoadLock(key string) *loadLock {
	return &loadLock{key: key, lock: LockKey(key), token: token.NewToken()}
}

func (l *loadLock) keys() []string { return []string{l.key, l.lock} }

// release gives the lock up and announces it on channel (if not "");
// [ErrLoadLockLost] if it is no longer ours.
func (l *loadLock) release(ctx context.Context, rdb redis.Scripter, channel string) error {
	return ownerChecked(unlockScript.Run(ctx, rdb, l.keys(), l.token, "", channel))
}

// extend sets the lease to ttl from now; [ErrLoadLockLost] if it is no longer ours.
func (l *loadLock) extend(ctx context.Context, rdb redis.Scripter, ttl time.Duration) error {
	return ownerChecked(unlockScript.Run(ctx, rdb, l.keys(), l.token, ttl.Milliseconds(), ""))
}
