// Package token holds what the cache's load lock and the standalone lock
// share: random owner tokens and the reply of an owner-checked script.
package token

import (
	"crypto/rand"
	"encoding/hex"

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
