// Package token holds what the cache's load lock and the standalone lock
// share: random owner tokens, the reply of an owner-checked script, and the
// waits that end with a context.
package token

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/redis/go-redis/v9"
)

// NewToken returns 128 random bits, hex-encoded.
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+): it crashes the program instead.
	return hex.EncodeToString(b[:])
}

// Owned turns the reply of an owner-checked script (1 done, 0 not ours) into
// true or false; errors come back unchanged.
func Owned(cmd *redis.Cmd) (bool, error) {
	n, err := cmd.Int()
	if err != nil {
		return false, err
	}
	return n != 0, nil
}

// CtxEnded reports whether ctx has ended, or is about to: a connection
// deadline taken from ctx (ContextTimeoutEnabled) can fire a moment before
// ctx's own timer, and then the call's error is only an i/o timeout. It
// waits for that moment, so that ctx.Err() is set when it returns true.
func CtxEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		<-ctx.Done()
		return true
	}
	return false
}

// Sleep waits d or until ctx ends; it reports whether ctx is still alive.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
