// lock.go is the load lock GetOrLoad takes on a miss. Every script that
// touches it names the value key first, so that a redis.Ring (which routes a
// script by its first key) keeps the value and its lock on one shard.

package cache

import (
	"sync/atomic"
	"time"

	_ "embed"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/clock"
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
	// renewed is the nanotime at which the call that last set the lock's
	// TTL was sent (its taking, then each extension): until a lock TTL
	// after it, only a Delete or Set can have voided the lock.
	renewed atomic.Int64
}

// voided reports whether a lock found lost was voided by a write (a
// Delete or Set: the write wins, by design) rather than lost by its lease
// running out (a holder frozen or cut off past its lock TTL).
func (l *loadLock) voided(lockTTL time.Duration) bool {
	return clock.Now()-l.renewed.Load() < int64(lockTTL)
}

func newLoadLock(key string) *loadLock {
	return &loadLock{key: key, lock: LockKey(key), token: token.NewToken()}
}

func (l *loadLock) keys() []string { return []string{l.key, l.lock} }
