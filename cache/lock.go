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
	"strconv"
	"strings"
	"sync"
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

func notAcquired(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return errors.Join(ErrLockNotAcquired, err)
	}
	return ErrLockNotAcquired
}

// newToken returns 128 random bits, hex-encoded.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+): it crashes the program instead.
	return hex.EncodeToString(b[:])
}

// lockKey names the load lock of a value key so that both hash to the same
// Redis Cluster slot, which the scripts need. A key with a hash tag keeps it;
// any other key becomes the tag ("{key}:lock"). A key that has no tag but
// holds a '}' cannot be a tag, so its lock is tagged with a short string from
// the same slot instead ("{T}:lock:key").
func lockKey(key string) string {
	if hasHashTag(key) {
		return key + ":lock"
	}
	if !strings.Contains(key, "}") {
		return "{" + key + "}:lock"
	}
	return "{" + slotTags()[crc16(key)%slots] + "}:lock:" + key
}

const slots = 16384

// slotTags maps each cluster slot to a short string that hashes to it, built
// once on first use (109,758 decimal strings are hashed before every slot
// has one).
var slotTags = sync.OnceValue(func() []string {
	tags := make([]string, slots)
	for n, left := 0, slots; left > 0; n++ {
		t := strconv.Itoa(n)
		if s := crc16(t) % slots; tags[s] == "" {
			tags[s] = t
			left--
		}
	}
	return tags
})

// hasHashTag reports whether Redis Cluster hashes only part of key: the text
// between the first '{' and the next '}', when not empty.
func hasHashTag(key string) bool {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return false
	}
	close := strings.IndexByte(key[open+1:], '}')
	return close > 0
}

// crc16 is CRC-16/XMODEM, the hash of Redis Cluster key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
