// This file checks the slot hash against the Redis Cluster specification
// and Companion's promises: same slot, one name per key, the key as prefix.

package slot

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stampede-go/stampede/internal/redistest"
)

// oddKeys are keys whose braces and bytes test the hash-tag rules.
var oddKeys = []string{
	"", "a", "product:42", "{user:7}:profile", "{user:7}", "user:7}", "{user:7",
	"a{b", "a}b", "{}x", "}{", "x{}y{z}", "{", "}", "{}", "{{}}", "{a}{b}", "a{{b}}c",
	"foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{}a}b", "a{b}c", ":fence", "a:fence",
	"sp ace\n\x00bin", "\xff\xfe{\x00}", "é{ü}",
	strings.Repeat("long:", 400), strings.Repeat("{", 300), strings.Repeat("}", 300),
	strings.Repeat("k", 1000) + "{tag}",
}

func TestOfMatchesSpec(t *testing.T) {
	// The examples of the Redis Cluster specification, "Hash tags".
	for _, tc := range []struct{ key, hashed string }{
		{"{user1000}.following", "user1000"},
		{"{user1000}.followers", "user1000"},
		{"foo{}{bar}", "foo{}{bar}"},
		{"foo{{bar}}zap", "{bar"},
		{"foo{bar}{zap}", "bar"},
		{"product:42", "product:42"},
	} {
		if got, want := Of(tc.key), CRC16(tc.hashed)%Count; got != want {
			t.Errorf("Of(%q) = %d; want %d, the slot of %q", tc.key, got, want, tc.hashed)
		}
	}
	if got := CRC16("123456789"); got != 0x31C3 {
		t.Errorf("CRC16(%q) = %#x; want 0x31c3", "123456789", got)
	}
}

func TestTagHashesToItsSlot(t *testing.T) {
	for s := range uint16(Count) {
		if got := Of("{" + Tag(s) + "}x"); got != s {
			t.Fatalf("Of({Tag(%d)}x) = %d; want %d", s, got, s)
		}
	}
}

func TestCompanionSameSlotAndPrefix(t *testing.T) {
	for _, key := range oddKeys {
		for _, suffix := range []string{":fence", ":x", ""} {
			c := Companion(key, suffix)
			if Of(c) != Of(key) {
				t.Errorf("Of(Companion(%q, %q) = %q) = %d; want Of(key) = %d", key, suffix, c, Of(c), Of(key))
			}
			if !StrayBrace(key) && !strings.HasPrefix(c, key) {
				t.Errorf("Companion(%q, %q) = %q; want it to start with the key", key, suffix, c)
			}
			if !strings.Contains(c, suffix) {
				t.Errorf("Companion(%q, %q) = %q does not contain the suffix", key, suffix, c)
			}
		}
	}
}

// TestCompanionSlotMatchesRedis asks a cluster-enabled Redis, not this
// package's CRC16, which slot each key and its companion are in.
func TestCompanionSlotMatchesRedis(t *testing.T) {
	srv := redistest.PrivateServer(t, "CLUSTER KEYSLOT needs a cluster-enabled Redis",
		"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf"))
	rdb := redistest.Client(t, srv.Addr)
	for _, key := range oddKeys {
		want, err := rdb.ClusterKeySlot(t.Context(), key).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
		}
		if want != int64(Of(key)) {
			t.Errorf("Of(%q) = %d; Redis says %d", key, Of(key), want)
		}
		c := Companion(key, ":fence")
		got, err := rdb.ClusterKeySlot(t.Context(), c).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", c, err)
		}
		if got != want {
			t.Errorf("Redis puts Companion(%q) = %q in slot %d; want the key's slot %d", key, c, got, want)
		}
	}
}

// companionKeys is every short string over an alphabet of braces, digits and
// letters, the odd keys, random binary keys, and companions taken as keys.
func companionKeys() []string {
	keys := append([]string(nil), oddKeys...)
	alphabet := []string{"a", "{", "}", ":", "0", "1", "7", "\x00"}
	level := []string{""}
	for range 5 {
		var next []string
		for _, k := range level {
			for _, c := range alphabet {
				next = append(next, k+c)
			}
		}
		keys = append(keys, next...)
		level = next
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := make([]byte, 1+r.IntN(12))
		for i := range b {
			b[i] = "ab{}:\x00\xff"[r.IntN(7)]
		}
		keys = append(keys, string(b))
	}
	for _, k := range oddKeys {
		keys = append(keys, Companion(k, ":fence"))
	}
	return keys
}

func TestCompanionOneToOne(t *testing.T) {
	seen := map[string]string{}
	for _, k := range companionKeys() {
		c := Companion(k, ":fence")
		if other, ok := seen[c]; ok && other != k {
			t.Errorf("Companion(%q) = Companion(%q) = %q; want one name per key", k, other, c)
		}
		seen[c] = k
	}
}

// TestCompanionOneToOneCrafted holds keys built to collide: a key without
// braces and the same key followed by its companion's hash tag, and a key
// with a stray '{' ending in the suffix and the tagged key that spells the
// start of its companion.
func TestCompanionOneToOneCrafted(t *testing.T) {
	for _, k := range []string{"42", "a", "product:42", "x{:fence", "a}b{:fence"} {
		var twin string
		if StrayBrace(k) {
			twin = strings.TrimSuffix(Companion(k, ":fence"), ":fence")
		} else {
			twin = fmt.Sprintf("%s{%s}", k, Tag(Of(k)))
		}
		if c, d := Companion(k, ":fence"), Companion(twin, ":fence"); c == d {
			t.Errorf("Companion(%q) = Companion(%q) = %q; want one name per key", k, twin, c)
		}
	}
}

func TestHasTag(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want bool
	}{
		{"{user:7}:profile", true}, {"a{b}c", true}, {"{{}}", true}, {"foo{}{bar}", false},
		{"", false}, {"a{b", false}, {"a}b", false}, {"{}x", false}, {"}{", false}, {"{", false},
	} {
		if got := HasTag(tc.key); got != tc.want {
			t.Errorf("HasTag(%q) = %v; want %v", tc.key, got, tc.want)
		}
	}
	for _, key := range oddKeys { // what the notifier's channel names rely on
		if HasTag(key) && Of(key+"{x}y") != Of(key) {
			t.Errorf("HasTag(%q), yet %q is in slot %d, not %d", key, key+"{x}y", Of(key+"{x}y"), Of(key))
		}
	}
}

// Under's names begin with the prefix, stray '{' or not, and share one
// slot and one Ring shard (hash tag text) across suffixes.
func TestUnderOneSlotAndThePrefix(t *testing.T) {
	for _, prefix := range append(oddKeys, "a{b:", "{", "x}{", "a{b}:") {
		if !HasUnder(prefix) {
			if !strings.HasPrefix(prefix[strings.IndexByte(prefix, '{'):], "{}") {
				t.Errorf("HasUnder(%q) = false; its first '{' is not closed at once", prefix)
			}
			continue
		}
		first := Under(prefix, ":stampede:tag#clock")
		for _, suffix := range []string{":stampede:tag:x", ":stampede:tag:%7By%7D", ":stampede:tag#all"} {
			u := Under(prefix, suffix)
			if !strings.HasPrefix(u, prefix) || !strings.HasSuffix(u, suffix) {
				t.Errorf("Under(%q, %q) = %q; want the prefix, then the suffix", prefix, suffix, u)
			}
			if Of(u) != Of(first) {
				t.Errorf("Under(%q, %q) = %q and %q in different slots", prefix, suffix, u, first)
			}
			ut, _ := hashTag(u)
			ft, _ := hashTag(first)
			if ut != ft || !HasTag(u) {
				t.Errorf("Under(%q, %q) = %q: hash tag %q, want %q (one Ring shard)", prefix, suffix, u, ut, ft)
			}
		}
	}
}
