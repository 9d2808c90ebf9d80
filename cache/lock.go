// This file is the load lock GetOrLoad takes on a miss, and its name. Every
// script that touches it names the value key first, so that a redis.Ring
// (which routes a script by its first key) keeps the value and its lock on
// one shard.

package cache

import (
	"sync/atomic"
	"time"

	_ "embed"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/clock"
	"github.com/stampede-go/stampede/internal/lockkey"
	"github.com/stampede-go/stampede/internal/token"
)

// LockKey returns the Redis key of the load lock that [Cache.GetOrLoad] takes
// for the value stored at valueKey (the full key, prefix included), for
// operators and tests. It is valueKey+"{T}:stampede:lock", where T is a short
// string that Redis Cluster hashes to valueKey's slot, or
// valueKey+"{}:stampede:lock" when valueKey has a hash tag (which then keeps
// deciding the slot). Both start with valueKey, so an ACL key pattern that
// grants the values ("~product:*") grants their locks. The one exception is a
// key with a '{' that opens no hash tag ("a{b"): its lock is
// "{T}:stampede:lock"+valueKey+"}", outside the prefix. The lock is in the
// value's slot, distinct for every value key, and never equal to a key the
// cache accepts (see [ErrReservedKey]).
func LockKey(valueKey string) string { return lockkey.Of(valueKey) }

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
	// renewed is the clock.Now at which the call that last set the lock's
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
