// rediserr.go sorts the errors Redis calls return: transient cluster states
// are waited out, outages go to the failure policy and the circuit breaker,
// and everything else (a wrong password, a missing permission, an unknown
// command) is a misconfiguration returned to the caller under every policy.

package cache

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

type errClass uint8

const (
	errNone      errClass = iota
	errTransient          // the cluster is moving or starting: wait and retry
	errOutage             // Redis cannot be reached: the failure policy decides
	errFatal              // Redis answered no: return it, whatever the policy
)

// transientPrefixes are replies that a short wait cures: a slot migrating
// (TRYAGAIN, ASK, MOVED after go-redis's own redirects), a cluster or a
// replica starting or failing over, a script still running.
var transientPrefixes = []string{"TRYAGAIN", "ASK", "MOVED", "CLUSTERDOWN", "LOADING", "READONLY", "MASTERDOWN", "BUSY"}

func classify(err error) errClass {
	if err == nil || errors.Is(err, redis.Nil) {
		return errNone
	}
	var reply redis.Error
	if !errors.As(err, &reply) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return errOutage // no reply: network, timeout, closed client
	}
	for _, p := range transientPrefixes {
		if redis.HasErrorPrefix(err, p) {
			return errTransient
		}
	}
	if redis.HasErrorPrefix(err, "OOM") {
		return errOutage // Redis is up but full: as good as down for a cache
	}
	return errFatal
}

func isWrongType(err error) bool { return redis.HasErrorPrefix(err, "WRONGTYPE") }
