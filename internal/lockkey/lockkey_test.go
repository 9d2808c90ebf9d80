package lockkey

import (
	"strings"
	"testing"
)

// TestLockNamesAreExactlyRefused: every lock name is a lock, and keys that
// only look like one (a wrong slot tag, a missing brace) are not: Is
// inverts Of exactly.
func TestLockNamesAreExactlyRefused(t *testing.T) {
	keys := []string{
		"", "a", "product:42", "{user:7}:profile", "{user:7}", "user:7}", "{user:7", "a{b", "a}b",
		"{}x", "}{", "x{}y{z}", "{", "}", "{}", "{{}}", "{a}{b}", "a{{b}}c", "sp ace\n\x00bin",
		":stampede:lock", "}:stampede:lock", "{}:stampede:lock", strings.Repeat("{", 50),
	}
	for _, k := range keys {
		lk := Of(k)
		if !Is(lk) {
			t.Errorf("Is(Of(%q) = %q) = false", k, lk)
		}
		if Is(k) {
			t.Errorf("Is(%q) = true; it is no key's lock", k)
		}
		// Near misses: each is either another key's lock, or accepted.
		for _, near := range []string{lk + "x", "x" + lk, lk[:len(lk)-1], lk[1:], strings.Replace(lk, "{", "{1", 1), strings.Replace(lk, "}", "1}", 1)} {
			if Is(near) != isSomeLock(near) {
				t.Errorf("Is(%q) = %v; want %v", near, Is(near), !Is(near))
			}
		}
	}
	for _, k := range []string{"product:{1}:stampede:lock", "product:{}:stampede:lock", "{1}:stampede:lockproduct:{}", "a{5716}:stampede:lock"} {
		if Is(k) {
			t.Errorf("Is(%q) = true; it is no key's lock", k)
		}
	}
	if !Is("product:42{5716}:stampede:lock") {
		t.Error(`Is("product:42{5716}:stampede:lock") = false`)
	}
}

// isSomeLock reports whether name is Of(k) for some k, by trying every
// k Of could have been given (written independently of Is).
func isSomeLock(name string) bool {
	for i := 0; i <= len(name); i++ {
		for j := i; j <= len(name); j++ {
			if Of(name[i:j]) == name {
				return true
			}
		}
	}
	return false
}

// TestLockNamesAreOneToOne: "user:7" and "{user:7}" once shared a lock, so
// one blocked the other and a Delete of one voided the other's load.
func TestLockNamesAreOneToOne(t *testing.T) {
	keys := []string{"user:7", "{user:7}", "{user:7}:lock", "user:7}", "{user:7", "a}b", "{}a}b", "", "{", "}"}
	seen := map[string]string{}
	for _, k := range keys {
		lk := Of(k)
		if other, ok := seen[lk]; ok {
			t.Errorf("Of(%q) = Of(%q) = %q", k, other, lk)
		}
		seen[lk] = k
		if !Is(lk) {
			t.Errorf("Is(Of(%q)) = false", k)
		}
		if Is(k) {
			t.Errorf("Is(%q) = true for a value key", k)
		}
	}
}
