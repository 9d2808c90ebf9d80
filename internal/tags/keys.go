// Package tags is a prefix's tag versions (see cache.WithTags): the keys
// they live at, all in one slot of the prefix; reading them, from memory
// while the near cache's tracker vouches for them, else from Redis; and
// checking a record's stamp against them.
package tags

import (
	"slices"
	"strings"

	"github.com/stampede-go/stampede/internal/slot"
)

// esc keeps a tag's braces from making a hash tag of their own; '%' keeps
// it one-to-one.
var esc = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// Key is tag's version key, in the slot of the prefix's others.
func (s *Versions) Key(tag string) string {
	return slot.Under(s.prefix, ":stampede:tag:"+esc.Replace(tag))
}

// Keys is the version keys of tags, deduplicated and sorted by tag.
func (s *Versions) Keys(tags []string) []string {
	keys := make([]string, 0, len(tags))
	for _, t := range Merge(tags, nil) {
		keys = append(keys, s.Key(t))
	}
	return keys
}

// Global reports a version key, or the clock: a key of the prefix that is
// no value's (see coherence.Hooks.Global), and that callers may not use.
func (s *Versions) Global(key string) bool { return strings.HasPrefix(key, s.base) }

// Base begins every version key (and the clock): a near cache tracks
// every write of them, whatever it read.
func (s *Versions) Base() string { return s.base }

// Depends reports what a change of Global key means to the values kept in
// memory: every value depends on the Cache's version (Clear); a tag's
// version, only the values that carry the tag (tagged); the clock, none
// (a stamp that read an older clock is only older).
func (s *Versions) Depends(key string) (all, tagged bool) {
	switch key {
	case s.All:
		return true, false
	case s.Clock:
		return false, false
	}
	return false, true
}

// Merge returns the distinct tags of a and b, sorted.
func Merge(a, b []string) []string {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}
