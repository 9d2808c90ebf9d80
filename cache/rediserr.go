// This file is how the cache names the classes of Redis errors
// (internal/rediserr sorts them) for its own client.

package cache

import "github.com/stampede-go/stampede/internal/rediserr"

type errClass = rediserr.Class

const (
	errNone      = rediserr.None
	errTransient = rediserr.Transient
	errOutage    = rediserr.Outage
	errFull      = rediserr.Full
	errFatal     = rediserr.Fatal
)

// classify sorts err for this cache's client: cluster states are
// misconfiguration for a client that is not a cluster client.
func (c *Cache[V]) classify(err error) errClass { return rediserr.Classify(err, c.cluster) }

var (
	isWrongType = rediserr.IsWrongType
	isReply     = rediserr.IsReply
	isNoScript  = rediserr.IsNoScript
)
