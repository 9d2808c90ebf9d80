package redistest

import (
	"context"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

func TestAddrAnswers(t *testing.T) {
	rdb := Client(t, Addr(t))
	p := Prefix(t, rdb)
	if err := rdb.Set(context.Background(), p+"k", "v", 0).Err(); err != nil {
		t.Fatalf("SET on the test Redis: %v", err)
	}
	if got, err := rdb.Get(context.Background(), p+"k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want %q, nil", got, err, "v")
	}
}

func TestDeletePrefixRemovesLockKeys(t *testing.T) {
	rdb := Client(t, Addr(t))
	p := "stampedetest:delprefix:[x]*?:"
	ctx := context.Background()
	// The value, its lock as cache.LockKey names it, and the older lock shape.
	mine := []string{p + "a", "{5716}:stampede:lock:" + p + "a", "{" + p + "a}:lock"}
	others := []string{"stampedetest:delprefix:other", "{5716}:stampede:lock:stampedetest:delprefix:other"}
	for _, k := range append(mine, others...) {
		rdb.Set(ctx, k, 1, 0)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), others...) })
	DeletePrefix(rdb, p)
	if n := rdb.Exists(ctx, mine...).Val(); n != 0 {
		t.Errorf("%d of %q left after DeletePrefix; want 0", n, mine)
	}
	if n := rdb.Exists(ctx, others...).Val(); n != int64(len(others)) {
		t.Errorf("DeletePrefix(%q) deleted keys outside the prefix: %d of %q left; want all", p, n, others)
	}
}

func TestPrivateServer(t *testing.T) {
	s := PrivateServer(t, "this test checks PrivateServer")
	if s.Addr == Addr(t) {
		t.Fatalf("PrivateServer shares the test Redis at %s", s.Addr)
	}
	if err := Client(t, s.Addr).Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING the private server: %v", err)
	}
}
