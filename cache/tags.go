// tags.go is tag invalidation and Clear (see WithTags). Every record of a
// Cache with tags carries a stamp: the prefix's tag clock, read before the
// value was loaded or written, and the value's tags. DeleteByTag and Clear
// advance the clock and set a version key (the tag's, or the Cache's) to
// it: a record whose tag, or whose Cache, has a version past its clock is
// no longer current, whichever slot it lives in. The versions live in one
// slot of the prefix; a process with a near cache keeps them in memory
// under the same coherence as values (their invalidation empties memory),
// so hits read them from memory.

package cache

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/slot"
)

var (
	//go:embed scripts/tags.lua
	tagsLua    string
	tagsScript = redis.NewScript(tagsLua)
)

// tagMemory is how long a version key outlives its last DeleteByTag or
// Clear, and so the longest a stamped record may live in Redis: a record
// stamped before the version must be gone when the version is. The clock
// is kept as long past the last of them (see scripts/tags.lua).
const tagMemory = 30 * 24 * time.Hour

// tagMemoMax bounds the versions kept in memory; past it they are read anew.
const tagMemoMax = 10_000

// ErrNoTags is returned by [Cache.DeleteByTag], [Cache.Clear] and by calls
// given [Tags] on a Cache made without [WithTags].
var ErrNoTags = errors.New("cache: tags and Clear need WithTags")

// tagState names a prefix's tag keys and keeps the versions read from them.
type tagState struct {
	base  string // what every tag key begins with: reserved
	clock string // the tag clock
	all   string // the Cache's version: Clear's
	esc   *strings.Replacer

	mu   sync.Mutex
	memo map[string]uint64 // versions by key, while the near cache's tracker vouches for them
}

func newTagState(prefix string) *tagState {
	return &tagState{
		base:  slot.Companion(prefix, ":stampede:tag"),
		clock: slot.Companion(prefix, ":stampede:tag#clock"),
		all:   slot.Companion(prefix, ":stampede:tag#all"),
		// a tag's braces must not make a hash tag of its own; '%' keeps it one-to-one
		esc:  strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D"),
		memo: map[string]uint64{},
	}
}

// key is tag's version key, in the slot of the others.
func (s *tagState) key(prefix, tag string) string {
	return slot.Companion(prefix, ":stampede:tag:"+s.esc.Replace(tag))
}

// global reports a version key (see coherence.Hooks.Global).
func (s *tagState) global(key string) bool { return strings.HasPrefix(key, s.base) }

// forget drops the versions kept in memory.
func (s *tagState) forget() {
	s.mu.Lock()
	clear(s.memo)
	s.mu.Unlock()
}

// recall returns the versions at keys if memory has all of them.
func (s *tagState) recall(keys []string) ([]uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	vs := make([]uint64, len(keys))
	for i, k := range keys {
		v, ok := s.memo[k]
		if !ok {
			return nil, false
		}
		vs[i] = v
	}
	return vs, true
}

// keep stores versions read under tk, and forgets them all if tk no
// longer holds (stored first, checked after, as near.keep does).
func (s *tagState) keep(track *coherence.Tracker, tk coherence.Ticket, keys []string, vs []uint64) {
	s.mu.Lock()
	if len(s.memo)+len(keys) > tagMemoMax {
		clear(s.memo)
	}
	for i, k := range keys {
		s.memo[k] = vs[i]
	}
	s.mu.Unlock()
	if !track.Valid(tk) {
		s.forget()
	}
}

// versions returns the versions at keys (0 for a key never set): from
// memory while the near cache serves, else from Redis.
func (c *Cache[V]) versions(ctx context.Context, keys []string) ([]uint64, error) {
	var track *coherence.Tracker
	if c.near != nil && c.near.track.Serving() {
		track = c.near.track
		if vs, ok := c.tags.recall(keys); ok {
			return vs, nil
		}
	}
	var tk coherence.Ticket
	if track != nil {
		tk = track.Ticket(keys[0]) // any key: their invalidation voids every ticket
	}
	got, err := c.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, err
	}
	vs := make([]uint64, len(keys))
	for i, g := range got {
		if s, ok := g.(string); ok {
			if vs[i], err = strconv.ParseUint(s, 10, 64); err != nil {
				return nil, fmt.Errorf("cache: tag version at %q is not a number: %q", keys[i], s)
			}
		}
	}
	if tk.OK() {
		c.tags.keep(track, tk, keys, vs)
	}
	return vs, nil
}

// current reports whether a record stamped st is current: neither its
// Cache nor any of its tags deleted at a later clock.
func (c *Cache[V]) current(ctx context.Context, st record.Stamp) (bool, error) {
	keys := c.versionKeys(nil, st)
	vs, err := c.versions(ctx, keys)
	if err != nil {
		return false, err
	}
	return slices.Max(vs) <= st.Clock, nil
}

// versionKeys appends the version keys a record stamped st depends on.
func (c *Cache[V]) versionKeys(keys []string, st record.Stamp) []string {
	keys = append(keys, c.tags.all)
	for _, t := range st.Tags {
		keys = append(keys, c.tags.key(c.cfg.prefix, t))
	}
	return keys
}

// currentAll is current for the records of a batch (raw, nil where none),
// with the versions of all of them read at once.
func (c *Cache[V]) currentAll(ctx context.Context, raw [][]byte) func(record.Stamp) (bool, error) {
	var keys []string
	for _, b := range raw {
		if _, _, err := record.Decode(b); err != nil {
			continue
		}
		if st, ok := record.ReadStamp(b); ok || c.cfg.tags {
			keys = c.versionKeys(keys, st)
		}
	}
	if len(keys) == 0 {
		return func(st record.Stamp) (bool, error) { return c.current(ctx, st) }
	}
	return c.currentOf(ctx, keys)
}

// currentOf reads the versions at keys at once and returns current for
// records whose version keys are among them.
func (c *Cache[V]) currentOf(ctx context.Context, keys []string) func(record.Stamp) (bool, error) {
	slices.Sort(keys)
	keys = slices.Compact(keys)
	vs, err := c.versions(ctx, keys)
	return func(st record.Stamp) (bool, error) {
		if err != nil {
			return false, err
		}
		for _, k := range c.versionKeys(nil, st) {
			if i, ok := slices.BinarySearch(keys, k); ok && vs[i] > st.Clock {
				return false, nil
			}
		}
		return true, nil
	}
}

// stampOf is the stamp of a value loaded or written now, with tags (nil
// without WithTags). A clock that cannot be read is an error: the value
// must then not be stored, since no stamp would be right.
func (c *Cache[V]) stampOf(ctx context.Context, tags []string) (*record.Stamp, error) {
	if !c.cfg.tags {
		return nil, nil
	}
	vs, err := c.versions(ctx, []string{c.tags.clock})
	if err != nil {
		return nil, fmt.Errorf("cache: read the tag clock: %w", err)
	}
	return &record.Stamp{Clock: vs[0], Tags: tags}, nil
}

// checkTags validates tags given to a call.
func (c *Cache[V]) checkTags(tags []string) error {
	if len(tags) == 0 {
		return nil
	}
	if !c.cfg.tags {
		return ErrNoTags
	}
	if slices.Contains(tags, "") {
		return errors.New("cache: empty tag")
	}
	return nil
}

// mergeTags returns the distinct tags of a and b, sorted.
func mergeTags(a, b []string) []string {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// deleteVersions advances the clock and sets the version keys of keys to
// it, confirmed with every near cache as any write is: DeleteByTag and
// Clear.
func (c *Cache[V]) deleteVersions(ctx context.Context, keys []string) error {
	if err := ctx.Err(); err != nil { // nothing to do for a caller who left
		return err
	}
	if !c.cfg.tags {
		return ErrNoTags
	}
	if !c.brk.Allow() {
		return c.brk.Err()
	}
	all := append([]string{c.tags.clock}, keys...)
	mem := tagMemory.Milliseconds()
	return c.writeConfirmed(ctx, keys, func(err error) errClass { return c.redisCall(keys[0], err) },
		func(p redis.Pipeliner) { p.Eval(ctx, tagsLua, all, mem) },
		func() error { return tagsScript.Run(ctx, c.rdb, all, mem).Err() })
}

// deleteByTag is DeleteByTag.
func (c *Cache[V]) deleteByTag(ctx context.Context, tags []string) error {
	if len(tags) == 0 {
		return nil
	}
	if err := c.checkTags(tags); err != nil {
		return err
	}
	keys := make([]string, 0, len(tags))
	for _, t := range mergeTags(tags, nil) {
		keys = append(keys, c.tags.key(c.cfg.prefix, t))
	}
	return c.deleteVersions(ctx, keys)
}

// stampRead returns the stamp of a record that record.Decode accepted,
// and whether the record is current. A Cache without WithTags checks only
// stamped records; one with it counts an unstamped record as stamped at
// clock 0 (written by a process without tags: current until a Clear). A
// version that cannot be read makes the record a miss, reported as a
// Redis error.
func (c *Cache[V]) stampRead(key string, b []byte, current func(record.Stamp) (bool, error)) (*record.Stamp, bool) {
	st, ok := record.ReadStamp(b)
	if !ok && !c.cfg.tags {
		return nil, true
	}
	cur, err := current(st)
	if err != nil {
		c.redisCall(key, err)
		return nil, false
	}
	return &st, cur
}

// vouched reports, for the stamps of records just committed (nil: not
// stamped), whether each record is still current: only then does the commit vouch for the value to callers
// that joined the load after it began. A DeleteByTag or Clear that returned
// meanwhile does not void the commit (the lock is not a tag's), so those
// callers ask again and find the record no longer current.
func (c *Cache[V]) vouched(ctx context.Context, stamps []*record.Stamp) []bool {
	ok := make([]bool, len(stamps))
	var keys []string
	for i, st := range stamps {
		ok[i] = st == nil
		if st != nil {
			keys = c.versionKeys(keys, *st)
		}
	}
	if len(keys) == 0 {
		return ok
	}
	current := c.currentOf(ctx, keys)
	for i, st := range stamps {
		if st != nil {
			ok[i], _ = current(*st)
		}
	}
	return ok
}
