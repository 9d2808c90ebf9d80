package redistest

import (
	"context"
	"errors"
	"net"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// hooked returns a client of the test Redis with h on it, and a key prefix.
func hooked(t *testing.T, hs ...redis.Hook) (*redis.Client, string) {
	t.Helper()
	rdb := Client(t, Addr(t))
	for _, h := range hs {
		rdb.AddHook(h)
	}
	return rdb, Prefix(t, rdb)
}

func TestCommandsCountsSinglesAndPipelines(t *testing.T) {
	c := &Commands{}
	rdb, p := hooked(t, c)
	ctx := t.Context()
	rdb.Set(ctx, p+"k", "v", 0)
	_, _ = rdb.Pipelined(ctx, func(pp redis.Pipeliner) error {
		pp.Get(ctx, p+"k")
		pp.Get(ctx, p+"k")
		return nil
	})
	if got := c.Count("get"); got != 2 {
		t.Errorf("Count(get) = %d; want 2", got)
	}
	if got := c.Dials(); got < 1 {
		t.Errorf("Dials() = %d; want the first connection", got)
	}
	total := c.Total()
	n, bytes := c.Take()
	if n["set"] != 1 || n["get"] != 2 || total < 3 {
		t.Errorf("Take() = %v, Total() = %d; want set 1, get 2", n, total)
	}
	if want := 2*len("get"+p+"k") + len("set"+p+"k"+"v"); bytes < want {
		t.Errorf("argument bytes %d; want at least %d", bytes, want)
	}
	if n, bytes := c.Take(); len(n) != 0 || bytes != 0 {
		t.Errorf("Take() after Take = %v, %d; want nothing", n, bytes)
	}
	rdb.Get(ctx, p+"k")
	c.Reset()
	if c.Total() != 0 || c.Dials() != 0 {
		t.Errorf("after Reset: Total %d, Dials %d; want 0", c.Total(), c.Dials())
	}

	only := &Commands{Match: Named("del")}
	rdb, p = hooked(t, only)
	rdb.Get(ctx, p+"k")
	rdb.Del(ctx, p+"k")
	if only.Total() != 1 || only.Count("del") != 1 {
		t.Errorf("with Match: Total %d, Count(del) %d; want 1, 1", only.Total(), only.Count("del"))
	}
}

func TestRecorderRounds(t *testing.T) {
	r := &Recorder{}
	rdb, p := hooked(t, r)
	ctx := t.Context()
	rdb.Ping(ctx) // the connection's handshake goes first
	r.Reset()
	rdb.Get(ctx, p+"a")
	_, _ = rdb.Pipelined(ctx, func(pp redis.Pipeliner) error {
		pp.Get(ctx, p+"a")
		pp.Set(ctx, p+"b", "v", 0)
		pp.Get(ctx, p+"b")
		return nil
	})
	var rounds [][]string
	for _, round := range r.Rounds() {
		if round[0] != "hello" && round[0] != "client" { // a new connection's handshake, whenever the pool dials
			rounds = append(rounds, round)
		}
	}
	if !reflect.DeepEqual(rounds, [][]string{{"get"}, {"get", "set", "get"}}) {
		t.Errorf("Rounds() = %q", r.Rounds())
	}
	if rounds, cmds := r.Count("get"); rounds != 2 || cmds != 3 {
		t.Errorf("Count(get) = %d, %d; want 2 rounds, 3 commands", rounds, cmds)
	}
	if r.Total() != 2 || r.Starting("get") != 2 || r.Starting("set") != 0 {
		t.Errorf("Total %d, Starting(get) %d, Starting(set) %d; want 2, 2, 0", r.Total(), r.Starting("get"), r.Starting("set"))
	}
	var args [][]any
	for _, a := range r.Args() {
		if a[0] != "hello" && a[0] != "client" {
			args = append(args, a)
		}
	}
	if len(args) != 4 || args[2][0] != "set" || args[2][1] != p+"b" {
		t.Errorf("Args() = %v", r.Args())
	}
}

func TestFailCommands(t *testing.T) {
	down := errors.New("LOADING")
	f := FailCommands(Named("get"), down, 2)
	rdb, p := hooked(t, f)
	ctx := t.Context()
	for i, want := range []error{down, down, redis.Nil} {
		if err := rdb.Get(ctx, p+"k").Err(); !errors.Is(err, want) {
			t.Errorf("GET %d: %v; want %v", i, err, want)
		}
	}
	if err := rdb.Set(ctx, p+"k", "v", 0).Err(); err != nil {
		t.Errorf("SET: %v; only GETs fail", err)
	}
	f = FailCommands(Named("get"), down, 1)
	rdb, p = hooked(t, f)
	_, err := rdb.Pipelined(ctx, func(pp redis.Pipeliner) error {
		pp.Set(ctx, p+"k", "v", 0)
		pp.Get(ctx, p+"k")
		return nil
	})
	if !errors.Is(err, down) || rdb.Exists(ctx, p+"k").Val() != 0 {
		t.Errorf("pipeline: %v; want it failed whole, unsent", err)
	}
	if f.Seen() != 1 {
		t.Errorf("Seen() = %d; want 1", f.Seen())
	}
}

func TestLoseReplies(t *testing.T) {
	rdb, p := hooked(t, LoseReplies(Named("set"), 1))
	ctx := t.Context()
	var op *net.OpError
	if err := rdb.Set(ctx, p+"k", "v1", 0).Err(); !errors.As(err, &op) {
		t.Errorf("first SET: %v; want a network error", err)
	}
	if got := rdb.Get(ctx, p+"k").Val(); got != "v1" {
		t.Errorf("GET = %q; want the SET whose reply was lost to have run", got)
	}
	if err := rdb.Set(ctx, p+"k", "v2", 0).Err(); err != nil {
		t.Errorf("second SET: %v; want its reply", err)
	}
}

func TestResend(t *testing.T) {
	rdb, p := hooked(t, Resend(Named("incr")))
	if got := rdb.Incr(t.Context(), p+"n").Val(); got != 2 {
		t.Errorf("INCR = %d; want 2, sent twice, the second reply kept", got)
	}
}

func TestDelay(t *testing.T) {
	rdb, p := hooked(t, Delay(Named("get"), 50*time.Millisecond))
	ctx := t.Context()
	rdb.Ping(ctx)
	start := time.Now()
	rdb.Get(ctx, p+"k")
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Errorf("GET took %v; want at least the delay", took)
	}
}

func TestReadGate(t *testing.T) {
	g := NewReadGate()
	rdb, p := hooked(t, g)
	ctx := t.Context()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { rdb.Get(context.WithoutCancel(ctx), p+"a") })
	if keys := g.Next(t); !reflect.DeepEqual(keys, []string{p + "a"}) {
		t.Errorf("Next() = %q", keys)
	}
	g.Release()
	wg.Go(func() { rdb.MGet(context.WithoutCancel(ctx), p+"b", p+"c") })
	if keys := g.Next(t); !reflect.DeepEqual(keys, []string{p + "b", p + "c"}) {
		t.Errorf("Next() = %q", keys)
	}
	g.Open()
	_, _ = rdb.Pipelined(ctx, func(pp redis.Pipeliner) error {
		pp.Get(ctx, p+"d")
		pp.MGet(ctx, p+"e")
		return nil
	})
	wg.Wait()
	if g.Count("get") != 2 || g.Count("mget") != 2 || g.Pipelines() != 1 {
		t.Errorf("Count(get) %d, Count(mget) %d, Pipelines %d; want 2, 2, 1", g.Count("get"), g.Count("mget"), g.Pipelines())
	}
}
