// Per-key holders: a strict per-key near cache registers as a holder of
// each key it reads to keep, and a write waits for its keys' holders only.

package coherence

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/confirm_keys.lua
	confirmKeysLua    string
	confirmKeysScript = redis.NewScript(confirmKeysLua)
)

// HoldTTL is how long a registration as a holder lasts in Redis after the
// last one of its key ([HoldersKey] expires then), and HoldMaxAge how long
// a per-key holder may keep a value read after registering: less, by the
// clock margins of the leases, so that no value outlives the registration
// that makes writers wait for it. The near cache caps its max age there.
//
// A registration is sent again only when this process's last one of the
// key is older than holdFresh (the registration of a key read again after
// each write would otherwise double the commands of its reads), so the
// last one may precede a read's ticket by up to holdFresh: memory keeps a
// value at most HoldMaxAge-holdFresh past its ticket (see [Ticket.Age]).
const (
	HoldTTL    = time.Minute
	HoldMaxAge = time.Duration(float64(HoldTTL)*(1-leaseDrift)) - leaseMargin
	holdFresh  = 20 * time.Second
	// HoldKeep is how long past its ticket a per-key holder may keep a
	// value: 38.4s.
	HoldKeep = HoldMaxAge - holdFresh
)

// holding lists the strict per-key trackers of the hub.
func (h *Hub) holding() []*Tracker {
	var out []*Tracker
	for _, t := range h.state.Load().trackers {
		if t.holdCh != "" {
			out = append(out, t)
		}
	}
	return out
}

// registrar is a reader's hook: before a read of a key that strict per-key
// trackers may keep (a GET or MGET under their prefix, not under their
// globals), it registers them as the key's holders, in the same pipeline,
// on the same connection, so the registration is done before the read:
//
//   - a write that ran before the registration is seen by the read;
//   - a write that ran after it finds the holder when it reads the key's
//     holders, which it does after the write, and waits for it.
//
// Writers never remove a registration; it expires HoldTTL after the last
// one, and the near cache keeps no value longer than HoldMaxAge past it.
// A registration that fails (maxmemory, an ACL) fails the reads, which
// then go through the user's client and are not kept.
type registrar struct {
	h      *Hub
	client func() *redis.Client // the reader's own client: a lone read is sent as a pipeline
}

func (g registrar) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g registrar) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if regs, _ := g.registrations(ctx, []redis.Cmder{cmd}); len(regs) == 0 {
			return next(ctx, cmd)
		}
		_, _ = g.client().Pipelined(ctx, func(p redis.Pipeliner) error { return p.Process(ctx, cmd) })
		return cmd.Err()
	}
}

func (g registrar) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		regs, noted := g.registrations(ctx, cmds)
		if len(regs) == 0 {
			return next(ctx, cmds)
		}
		sent := nanotime()
		epochs := make([]uint64, len(noted))
		for i, n := range noted {
			epochs[i] = n.t.epoch.Load()
		}
		err := next(ctx, append(regs, cmds...))
		for _, r := range regs {
			if rerr := r.Err(); rerr != nil {
				rerr = fmt.Errorf("near cache: registering as a holder: %w", rerr)
				for _, c := range cmds {
					c.SetErr(rerr)
				}
				return rerr
			}
		}
		for i, n := range noted {
			if n.t.epoch.Load() == epochs[i] { // no drop since: nothing says the registration was lost
				n.t.registered.Store(n.key, sent)
			}
		}
		return err
	}
}

// registration is a key a tracker registered as its holder.
type registration struct {
	t   *Tracker
	key string
}

// registrations are the commands that register the holders of the keys
// cmds read: for each key, an HSET of the holders whose last registration
// of it is older than holdFresh, and a PEXPIRE; and those registrations.
func (g registrar) registrations(ctx context.Context, cmds []redis.Cmder) (regs []redis.Cmder, noted []registration) {
	holders := g.h.holding()
	if len(holders) == 0 {
		return nil, nil
	}
	now := nanotime()
	for _, c := range cmds {
		for _, key := range readKeys(c) {
			var args []any
			for _, t := range holders {
				if !strings.HasPrefix(key, t.prefix) || strings.HasPrefix(key, t.globals) {
					continue
				}
				if at, ok := t.registered.Load(key); ok && now-at.(int64) < int64(holdFresh) {
					continue
				}
				if args == nil {
					args = []any{"hset", HoldersKey(key)}
				}
				args = append(args, t.id, "1")
				noted = append(noted, registration{t, key})
			}
			if args != nil {
				regs = append(regs, redis.NewIntCmd(ctx, args...), redis.NewBoolCmd(ctx, "pexpire", args[1], HoldTTL.Milliseconds()))
			}
		}
	}
	return regs, noted
}

// forgetRegistrations forgets the registrations older than holdFresh,
// which reads send again anyway; at most every holdFresh/2 (a walk of the
// map). Called by the renewals' goroutine alone.
func (t *Tracker) forgetRegistrations() {
	now := nanotime()
	if now-t.sweptAt < int64(holdFresh/2) {
		return
	}
	t.sweptAt = now
	old := now - int64(holdFresh)
	t.registered.Range(func(k, at any) bool {
		if at.(int64) < old {
			t.registered.Delete(k)
		}
		return true
	})
}

// readKeys are the keys a GET or MGET reads (none for other commands).
func readKeys(c redis.Cmder) []string {
	args := c.Args()
	var from int
	switch strings.ToLower(c.Name()) {
	case "get":
		args, from = args[:min(len(args), 2)], 1
	case "mget":
		from = 1
	default:
		return nil
	}
	keys := make([]string, 0, len(args)-from)
	for _, a := range args[from:] {
		if k, ok := a.(string); ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// keyed reports whether writes confirm per key (confirm_keys.lua): on a
// single server or a cluster, unless an ACL refused the per-key registry
// less than RegistryRetry ago.
func (t *Tracker) keyed() bool {
	switch t.rdb.(type) {
	case *redis.Client, *redis.ClusterClient:
	default:
		return false
	}
	at := t.holdRefusedAt.Load()
	return at == 0 || nanotime()-at >= int64(RegistryRetry)
}

// fleet reports whether a write of keys must be confirmed by every per-key
// holder: it writes a key they all track (a tag or Clear version).
func (t *Tracker) fleet(keys []string) bool {
	for _, k := range keys {
		if t.hooks.Global(k) {
			return true
		}
	}
	return false
}

// confirmKeysCmd adds to p the per-key confirmation of a write of keys
// (see confirm_keys.lua), with ids the holders already read (a cluster's).
// On a single server the keys' holders are read in the script, and with
// markerKey (the write's own pipeline) the holders that track by prefix are
// told by the marker key; otherwise, the write having returned, by a
// PUBLISH.
func (t *Tracker) confirmKeysCmd(ctx context.Context, p redis.Scripter, keys []string, marker string, fleet, markerKey bool, ids []string, run bool) *redis.Cmd {
	skeys := []string{HoldRegistryKey(t.prefix), RegistryKey(t.prefix), LegacyRegistryKey(t.prefix), t.markKeys + marker}
	if _, single := t.rdb.(*redis.Client); single && !fleet {
		for _, k := range keys {
			skeys = append(skeys, HoldersKey(k))
		}
	}
	args := []any{t.markCh, marker, flag(fleet), holdChannel(t.prefix, ""), flag(markerKey)}
	for _, id := range ids {
		args = append(args, id)
	}
	if run {
		return confirmKeysScript.Run(ctx, p, skeys, args...)
	}
	return confirmKeysScript.EvalSha(ctx, p, skeys, args...)
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// confirmKeys announces a write of keys that returned and waits for the
// acknowledgements of their holders (see confirm_keys.lua). On a cluster
// the keys' holders lie in their own slots: they are read, after the
// write, only when some per-key lease runs, and the script runs again with
// them. A Redis that refuses the script (an ACL without the per-key
// registry or a command it runs, a proxy that wants one slot per script)
// makes the write confirm as earlier versions did, for a while.
func (t *Tracker) confirmKeys(ctx context.Context, keys []string) error {
	seq, marker, cf := t.begin()
	defer t.end(seq)
	fleet := t.fleet(keys)
	reply, recv, err := t.runKeys(ctx, keys, marker, fleet, nil)
	if _, single := t.rdb.(*redis.Client); err == nil && !single && !fleet && perKeyLeases(reply) {
		var ids []string
		if ids, err = t.holdersOf(ctx, keys); err == nil && len(ids) > 0 {
			first := reply
			if reply, recv, err = t.runKeys(ctx, keys, marker, false, ids); err == nil {
				reply[1] = max(sinceOf(first), sinceOf(reply)) // a loss the first run found counts too
				t.forgetDead(ctx, keys, reply)
			}
		}
	}
	if refusedScript(err) {
		t.holdRefusedAt.Store(nanotime())
		return t.confirm(ctx)
	}
	if err != nil {
		return err
	}
	cf.holdersAlone = toHoldersAlone(reply)
	return t.await(ctx, cf, marker, leasesOf(reply), recv)
}

// refusedScript reports whether err is Redis refusing confirm_keys.lua
// rather than failing it: an ACL refusing a key or a command of it, or
// keys in several slots where a proxy wants one.
func refusedScript(err error) bool {
	if err == nil {
		return false
	}
	// Redis 6.2 and 7.0 say a script's command "can't run"; 7.2 and Valkey
	// 8, "ACL failure in script: ... has no permissions to run".
	msg := strings.ToLower(err.Error())
	return redis.HasErrorPrefix(err, "NOPERM") || redis.HasErrorPrefix(err, "CROSSSLOT") ||
		strings.Contains(msg, "can't run this command") || strings.Contains(msg, "no permissions") ||
		strings.Contains(msg, "acl failure")
}

func sinceOf(reply []any) int64 {
	n, _ := reply[1].(int64)
	return n
}

// forgetDead removes from the holders of keys those confirm_keys.lua found
// gone (after "~dead"), on a cluster; best effort.
func (t *Tracker) forgetDead(ctx context.Context, keys []string, reply []any) {
	i := slices.Index(reply, any("~dead"))
	if i < 0 {
		return
	}
	ids := reply[i+1:]
	_, _ = t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.HDel(ctx, HoldersKey(k), anysToStrings(ids)...)
		}
		return nil
	})
}

func anysToStrings(vs []any) []string {
	out := make([]string, 0, len(vs))
	for _, v := range vs {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// runKeys runs confirm_keys.lua and returns its reply and when it came.
func (t *Tracker) runKeys(ctx context.Context, keys []string, marker string, fleet bool, ids []string) ([]any, int64, error) {
	reply, err := t.confirmKeysCmd(ctx, t.rdb, keys, marker, fleet, false, ids, true).Slice()
	return reply, nanotime(), err
}

// holdersOf reads the holders of keys on a cluster, in one pipeline.
func (t *Tracker) holdersOf(ctx context.Context, keys []string) ([]string, error) {
	cmds := make([]*redis.StringSliceCmd, len(keys))
	_, err := t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.HKeys(ctx, HoldersKey(k))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, c := range cmds {
		ids = append(ids, c.Val()...)
	}
	return ids, nil
}

// perKeyLeases reads confirm_keys.lua's flags: some per-key lease runs.
func perKeyLeases(reply []any) bool { return keysFlags(reply)&1 != 0 }

// toHoldersAlone reads confirm_keys.lua's flags: the write was announced
// to its keys' holders alone, and is asked again of them alone.
func toHoldersAlone(reply []any) bool { return keysFlags(reply)&2 == 0 }

func keysFlags(reply []any) int64 {
	if len(reply) < 3 {
		return 0
	}
	n, _ := reply[2].(int64)
	return n
}

// publishToHolders publishes marker on the channels of holders, in one
// pipeline (see asker).
func (t *Tracker) publishToHolders(ctx context.Context, marker string, holders []string) error {
	_, err := t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range holders {
			p.Publish(ctx, holdChannel(t.prefix, id), marker)
		}
		return nil
	})
	return err
}

// leasesOf turns confirm_keys.lua's reply into confirm.lua's shape (see
// parseLeases), which parseLeases refuses if it is not one.
func leasesOf(reply []any) []any {
	if len(reply) < 3 {
		return reply
	}
	if i := slices.Index(reply, any("~dead")); i >= 0 {
		reply = reply[:i]
	}
	return append(reply[:2:2], reply[3:]...)
}
