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

// clusterOnly are the transient replies that only a cluster client can wait
// out: a plain client that gets them is pointed at a cluster node, which no
// wait cures.
var clusterOnly = []string{"TRYAGAIN", "ASK", "MOVED", "CLUSTERDOWN"}

// classify is classify for this client: cluster states are misconfiguration
// for a client that is not a cluster client.
func (c *Cache[V]) classify(err error) errClass {
	class := classify(err)
	if class == errTransient && !c.cluster {
		for _, p := range clusterOnly {
			if redis.HasErrorPrefix(err, p) {
				return errFatal
			}
		}
	}
	return class
}

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
