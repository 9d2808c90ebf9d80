package tags

import "testing"

// What a change of each version key drops from a near cache: Clear's,
// everything; a tag's, the values with the tag; the clock's, no value.
func TestDepends(t *testing.T) {
	s := New(nil, "p:", true)
	for _, tc := range []struct {
		key         string
		all, tagged bool
	}{
		{s.All, true, false},
		{s.Clock, false, false},
		{s.Key("cat:7"), false, true},
		{s.Key("#all"), false, true}, // a tag named like Clear's key is a tag
	} {
		if all, tagged := s.Depends(tc.key); all != tc.all || tagged != tc.tagged {
			t.Errorf("Depends(%q) = %v, %v; want %v, %v", tc.key, all, tagged, tc.all, tc.tagged)
		}
	}
}

func TestForgetKey(t *testing.T) {
	s := New(nil, "p:", true)
	a, b := s.Key("a"), s.Key("b")
	s.memo[a], s.memo[b] = 1, 2
	s.ForgetKey(a)
	if vs, ok := s.recall([]string{b}); !ok || vs[0] != 2 {
		t.Fatalf("recall(b) after ForgetKey(a) = %v, %v; want [2], true", vs, ok)
	}
	if _, ok := s.recall([]string{a}); ok {
		t.Fatal("recall(a) after ForgetKey(a) found it")
	}
}
