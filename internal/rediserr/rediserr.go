// Package rediserr sorts the errors Redis calls return: transient cluster
// states are waited out, outages go to the failure policy and the circuit
// breaker, a full Redis is told apart from a down one, and everything else
// (a wrong password, a missing permission, an unknown command, a client
// the program closed) is a misconfiguration returned to the caller under
// every policy.
package rediserr

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Class is what an error of a Redis call means to the caller.
type Class uint8

const (
	None      Class = iota
	Transient       // the cluster is moving or starting: wait and retry
	Outage          // Redis cannot be reached: the failure policy decides
	Full            // Redis answered OOM: it is up and serves reads, but cannot store
	Fatal           // Redis answered no: return it, whatever the policy
)

// transientPrefixes are replies that a short wait cures: a slot migrating
// (TRYAGAIN, ASK, MOVED after go-redis's own redirects), a cluster or a
// replica starting or failing over, a script still running.
var transientPrefixes = []string{"TRYAGAIN", "ASK", "MOVED", "CLUSTERDOWN", "LOADING", "READONLY", "MASTERDOWN", "BUSY"}

// clusterOnly are the transient replies that only a cluster client can wait
// out: a plain client that gets them is pointed at a cluster node, which no
// wait cures.
var clusterOnly = []string{"TRYAGAIN", "ASK", "MOVED", "CLUSTERDOWN"}

// Classify sorts err; cluster says whether the client is a cluster client
// (cluster states are misconfiguration for one that is not).
func Classify(err error, cluster bool) Class {
	if err == nil || errors.Is(err, redis.Nil) {
		return None
	}
	if IsClosed(err) { // the program closed the client: no wait or policy cures it
		return Fatal
	}
	var reply redis.Error
	if !errors.As(err, &reply) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return Outage // no reply: network, timeout
	}
	for _, p := range transientPrefixes {
		if redis.HasErrorPrefix(err, p) {
			if !cluster && isClusterOnly(err) {
				return Fatal
			}
			return Transient
		}
	}
	// Redis 7 returns a script's OOM as such; Redis 6 wraps it in "ERR Error
	// running script ...: -OOM command not allowed ...".
	if redis.HasErrorPrefix(err, "OOM") || strings.Contains(err.Error(), "-OOM command not allowed") {
		return Full
	}
	return Fatal
}

func isClusterOnly(err error) bool {
	for _, p := range clusterOnly {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// IsClosed reports a call on a go-redis client the program closed: a
// programming error, returned as such, which says nothing of Redis's
// health.
func IsClosed(err error) bool { return errors.Is(err, redis.ErrClosed) }

// IsWrongType reports a WRONGTYPE reply: a key of another type where a value
// was expected.
func IsWrongType(err error) bool { return redis.HasErrorPrefix(err, "WRONGTYPE") }

// IsReply reports whether err is a reply from Redis (so the command surely
// ran or surely did not), rather than a network error or timeout after which
// nobody knows.
func IsReply(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && !errors.Is(err, redis.ErrClosed)
}

// IsUnknownCommand reports whether err is Redis saying it lacks a command
// or subcommand (an older server, or one that is not Redis).
func IsUnknownCommand(err error) bool {
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown subcommand")
}

// IsNoScript reports a NOSCRIPT reply: an EVALSHA of a script the server
// does not have (never loaded there, or flushed), which ran nothing.
func IsNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }
