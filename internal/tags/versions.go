package tags

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/coherence"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/redisio"
	"github.com/stampede-go/stampede/internal/slot"
)

// memoMax bounds the versions kept in memory, and guessMax the keys whose
// tags Guess remembers; past them they are read anew.
const (
	memoMax  = 10_000
	guessMax = 1 << 16
)

// Versions is one prefix's tag versions. Safe for concurrent use once
// Track, if called, has returned.
type Versions struct {
	Clock  string // the tag clock: a record's stamp is its value when the record was loaded or written
	All    string // the Cache's version: Clear's
	base   string // what every version key begins with
	prefix string
	rdb    redis.UniversalClient
	mget   func(ctx context.Context, keys []string) ([]any, error) // from the keys' master
	on     bool                                                    // WithTags: a record without a stamp counts as stamped at clock 0
	track  *coherence.Tracker                                      // the near cache's; nil: none, nothing is kept
	gate   func() error                                            // non-nil error: keep the read off Redis (see Guard)
	record func(key string, err error)                             // told of every read's outcome (see Guard)

	mu   sync.Mutex
	memo map[string]uint64 // versions by key, while track vouches for them

	gmu     sync.Mutex
	guesses map[string]guess // value key -> its record's tags at its last read (Guess)
}

// New returns the versions of prefix, read from rdb's masters (never a
// replica, which may not have a DeleteByTag yet); on says the Cache has
// WithTags.
func New(rdb redis.UniversalClient, prefix string, on bool) *Versions {
	return &Versions{
		mget:    redisio.New(rdb, nil, false).MGetSlot, // no coalesced reads: no batch context
		Clock:   slot.Under(prefix, ":stampede:tag#clock"),
		All:     slot.Under(prefix, ":stampede:tag#all"),
		base:    slot.Under(prefix, ":stampede:tag"),
		prefix:  prefix,
		rdb:     rdb,
		on:      on,
		memo:    map[string]uint64{},
		guesses: map[string]guess{},
	}
}

// Track makes the versions kept in memory while track serves (the near
// cache's tracker, whose invalidation of a version key empties memory).
// Called before any read.
func (s *Versions) Track(track *coherence.Tracker) { s.track = track }

// Guard puts every read from Redis behind a circuit breaker: gate is
// asked first, and its error (the open breaker's) returned instead of
// sending the read, so that an outage costs no dial here either; record
// is told of each read's outcome (the first version key and the read's
// error). Called before any read.
func (s *Versions) Guard(gate func() error, record func(key string, err error)) {
	s.gate, s.record = gate, record
}

// Forget drops the versions kept in memory.
func (s *Versions) Forget() {
	s.mu.Lock()
	clear(s.memo)
	s.mu.Unlock()
}

// ForgetKey drops the version at key (a version key, or the clock) kept in
// memory: it changed, and the others still hold.
func (s *Versions) ForgetKey(key string) {
	s.mu.Lock()
	delete(s.memo, key)
	s.mu.Unlock()
}

// recall returns the versions at keys if memory has all of them.
func (s *Versions) recall(keys []string) ([]uint64, bool) {
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
// longer holds: stored first, checked after (as the near cache does), and
// both under the lock, so that no recall sees versions whose check is
// about to fail (Valid takes no lock; an invalidation's Forget waits).
func (s *Versions) keep(tk coherence.Ticket, keys []string, vs []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.memo)+len(keys) > memoMax {
		clear(s.memo)
	}
	for i, k := range keys {
		s.memo[k] = vs[i]
	}
	if !s.track.Valid(tk) {
		clear(s.memo)
	}
}

// Read returns the versions at keys (0 for a key never set): from memory
// while the near cache serves, else from Redis.
func (s *Versions) Read(ctx context.Context, keys []string) ([]uint64, error) {
	var tk coherence.Ticket
	if s.track != nil && s.track.Serving() {
		if vs, ok := s.recall(keys); ok {
			return vs, nil
		}
		tk = s.track.Ticket(keys[0]) // any key: their invalidation voids every ticket
	}
	if s.gate != nil {
		if err := s.gate(); err != nil {
			return nil, err
		}
	}
	got, err := s.mget(ctx, keys)
	if s.record != nil {
		s.record(keys[0], err)
	}
	if err != nil {
		return nil, err
	}
	vs, err := parseVersions(keys, got)
	if err != nil {
		return nil, err
	}
	if tk.OK() {
		s.keep(tk, keys, vs)
	}
	return vs, nil
}

// Stamp is the stamp of a value loaded or written now, with tags (nil
// without WithTags). A clock that cannot be read is an error: the value
// must then not be stored, since no stamp would be right.
func (s *Versions) Stamp(ctx context.Context, tags []string) (*record.Stamp, error) {
	if !s.on {
		return nil, nil
	}
	vs, err := s.Read(ctx, []string{s.Clock})
	if err != nil {
		return nil, fmt.Errorf("cache: read the tag clock: %w", err)
	}
	return &record.Stamp{Clock: vs[0], Tags: tags}, nil
}

// Current reports whether a record stamped st is current: neither its
// Cache nor any of its tags deleted at a later clock.
func (s *Versions) Current(ctx context.Context, st record.Stamp) (bool, error) {
	vs, err := s.Read(ctx, s.keysOf(nil, st))
	if err != nil {
		return false, err
	}
	return slices.Max(vs) <= st.Clock, nil
}

// keysOf appends the version keys a record stamped st depends on.
func (s *Versions) keysOf(keys []string, st record.Stamp) []string {
	keys = append(keys, s.All)
	for _, t := range st.Tags {
		keys = append(keys, s.Key(t))
	}
	return keys
}

// CurrentAll is Current for the records of a batch (raw, nil where none),
// with the versions of all of them read at once.
func (s *Versions) CurrentAll(ctx context.Context, raw [][]byte) func(record.Stamp) (bool, error) {
	var keys []string
	for _, b := range raw {
		if _, _, err := record.Decode(b); err != nil {
			continue
		}
		if st, ok := record.ReadStamp(b); ok || s.on {
			keys = s.keysOf(keys, st)
		}
	}
	if len(keys) == 0 {
		return func(st record.Stamp) (bool, error) { return s.Current(ctx, st) }
	}
	return s.currentOf(ctx, keys)
}

// currentOf reads the versions at keys at once and returns Current for
// records whose version keys are among them.
func (s *Versions) currentOf(ctx context.Context, keys []string) func(record.Stamp) (bool, error) {
	slices.Sort(keys)
	keys = slices.Compact(keys)
	vs, err := s.Read(ctx, keys)
	return func(st record.Stamp) (bool, error) {
		if err != nil {
			return false, err
		}
		for _, k := range s.keysOf(nil, st) {
			if i, ok := slices.BinarySearch(keys, k); ok && vs[i] > st.Clock {
				return false, nil
			}
		}
		return true, nil
	}
}

// Vouched reports, for the stamps of records just committed (nil: not
// stamped), whether each record is still current: only then does the
// commit vouch for the value to callers that joined the load after it
// began. A DeleteByTag or Clear that returned meanwhile does not void the
// commit (the lock is not a tag's), so those callers ask again and find
// the record no longer current.
func (s *Versions) Vouched(ctx context.Context, stamps []*record.Stamp) []bool {
	ok := make([]bool, len(stamps))
	var keys []string
	for i, st := range stamps {
		ok[i] = st == nil
		if st != nil {
			keys = s.keysOf(keys, *st)
		}
	}
	if len(keys) == 0 {
		return ok
	}
	current := s.currentOf(ctx, keys)
	for i, st := range stamps {
		if st != nil {
			ok[i], _ = current(*st)
		}
	}
	return ok
}

// parseVersions reads the versions an MGET of keys returned (0 for a key
// never set).
func parseVersions(keys []string, got []any) ([]uint64, error) {
	if len(got) != len(keys) {
		return nil, fmt.Errorf("cache: tag versions: %d replies for %d keys", len(got), len(keys))
	}
	vs := make([]uint64, len(keys))
	for i, g := range got {
		if v, ok := g.(string); ok {
			var err error
			if vs[i], err = strconv.ParseUint(v, 10, 64); err != nil {
				return nil, fmt.Errorf("cache: tag version at %q is not a number: %q", keys[i], v)
			}
		}
	}
	return vs, nil
}

// OneTrip reports whether reads should fetch the versions with the value
// (Guess, With): a Cache with
// tags on a single server, whose near cache (if any) does not serve, so
// that no versions are in memory.
func (s *Versions) OneTrip() bool {
	if !s.on {
		return false
	}
	_, single := s.rdb.(*redis.Client)
	return single && (s.track == nil || !s.track.Serving())
}

// Guess returns the tags key's record had at its last read (a value's
// tags seldom change) and the version keys they need, to read with the
// value in one MGET (see With).
func (s *Versions) Guess(key string) (tags, keys []string) {
	s.gmu.Lock()
	g, ok := s.guesses[key]
	s.gmu.Unlock()
	if !ok {
		return nil, []string{s.All}
	}
	return g.tags, g.keys
}

// guess is what Guess remembers of a key: its tags and their version keys,
// built once.
type guess struct{ tags, keys []string }

// With is Current for the record read at key together with the versions
// at keys (vals, their MGET replies), which Guess gave for tags: when the
// record's tags are those it answers from vals, the versions at the moment
// the record was read; else it reads the versions as Current does.
func (s *Versions) With(ctx context.Context, key string, tags, keys []string, vals []any) func(record.Stamp) (bool, error) {
	return func(st record.Stamp) (bool, error) {
		if !slices.Equal(st.Tags, tags) { // the guess was wrong: read them, guess better next time
			s.remember(key, st.Tags)
			return s.Current(ctx, st)
		}
		vs, err := parseVersions(keys, vals)
		if err != nil {
			return false, err
		}
		return slices.Max(vs) <= st.Clock, nil
	}
}

// remember notes the tags of key's record for its next Guess.
func (s *Versions) remember(key string, tags []string) {
	s.gmu.Lock()
	defer s.gmu.Unlock()
	if len(s.guesses) >= guessMax {
		clear(s.guesses)
	}
	s.guesses[key] = guess{tags, s.keysOf(nil, record.Stamp{Tags: tags})}
}
