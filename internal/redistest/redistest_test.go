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
	p := "stampedetest:delprefix:"
	ctx := context.Background()
	rdb.Set(ctx, p+"a", 1, 0)
	rdb.Set(ctx, "{"+p+"a}:lock", 1, 0)
	DeletePrefix(rdb, p)
	if n := rdb.Exists(ctx, p+"a", "{"+p+"a}:lock").Val(); n != 0 {
		t.Fatalf("%d keys left after DeletePrefix; want 0", n)
	}
}
