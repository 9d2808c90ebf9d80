// This file tests the coalescing of reads against a real Redis: a lone
// read goes at once, the reads queued meanwhile go out as one MGET, a reader
// leaves when its ctx ends, and each read gets its own reply.

package redisio

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stampede-go/stampede/internal/redistest"
)

// newGatedClient returns a client of the test Redis with a gate on, a key
// prefix for the test, and a Client reading through it.
func newGatedClient(t *testing.T) (*redistest.ReadGate, *redis.Client, string, *Client) {
	t.Helper()
	rdb := redistest.Client(t, redistest.Addr(t))
	g := redistest.NewReadGate()
	rdb.AddHook(g)
	return g, rdb, redistest.Prefix(t, rdb), New(rdb, t.Context, false)
}

// queued waits until n reads wait for the next batch.
func queued(t *testing.T, cl *Client, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := cl.Queued()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d reads queued; want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestConcurrentReadsGoOutAsOneMGet: 50 reads of 50 keys while a GET is on
// the wire: the 49 that arrived meanwhile go out as one MGET, not 49 GETs.
func TestConcurrentReadsGoOutAsOneMGet(t *testing.T) {
	gate, rdb, p, cl := newGatedClient(t)
	keys := make([]string, 50)
	for i := range keys {
		keys[i] = p + strconv.Itoa(i)
		require.NoError(t, rdb.Set(t.Context(), keys[i], "v"+keys[i], 0).Err())
	}
	var wg sync.WaitGroup
	var wrong atomic.Int64
	read := func(k string) {
		b, err := cl.Get(t.Context(), k)
		if err != nil || string(b) != "v"+k {
			wrong.Add(1)
		}
	}
	wg.Go(func() { read(keys[0]) })
	assert.Equal(t, []string{keys[0]}, gate.Next(t), "a lone read goes out at once, as a GET")
	for _, k := range keys[1:] {
		wg.Go(func() { read(k) })
	}
	queued(t, cl, 49)
	gate.Release()
	assert.ElementsMatch(t, keys[1:], gate.Next(t), "the reads queued meanwhile go out together")
	gate.Open()
	wg.Wait()
	assert.Zero(t, wrong.Load(), "reads with a wrong value or an error")
	assert.Equal(t, 1, gate.Count("get"))
	assert.Equal(t, 1, gate.Count("mget"))
}

// TestReadsWithOtherKeysJoinTheBatch: reads that carry keys of their own
// (GetWith: a tagged value and its versions) go out in the same MGET as
// plain reads, each getting its value and its keys' replies in order; a
// lone one goes out as one MGET.
func TestReadsWithOtherKeysJoinTheBatch(t *testing.T) {
	gate, rdb, p, cl := newGatedClient(t)
	for _, k := range []string{"a", "b", "x", "y"} {
		require.NoError(t, rdb.Set(t.Context(), p+k, "v"+k, 0).Err())
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		b, vals, err := cl.GetWith(t.Context(), p+"a", []string{p + "x", p + "none"})
		assert.NoError(t, err)
		assert.Equal(t, "va", string(b))
		assert.Equal(t, []any{"vx", nil}, vals)
	})
	assert.Equal(t, []string{p + "a", p + "x", p + "none"}, gate.Next(t), "a lone read with keys goes out at once, as one MGET")
	wg.Go(func() {
		b, err := cl.Get(t.Context(), p+"b")
		assert.NoError(t, err)
		assert.Equal(t, "vb", string(b))
	})
	wg.Go(func() {
		b, vals, err := cl.GetWith(t.Context(), p+"none", []string{p + "y"})
		assert.ErrorIs(t, err, redis.Nil)
		assert.Nil(t, b)
		assert.Equal(t, []any{"vy"}, vals)
	})
	queued(t, cl, 2)
	gate.Release()
	assert.ElementsMatch(t, []string{p + "b", p + "none", p + "y"}, gate.Next(t), "queued reads and their keys go out together")
	gate.Open()
	wg.Wait()
	assert.Equal(t, 0, gate.Count("get"))
	assert.Equal(t, 2, gate.Count("mget"))
}

// TestABatchReadsEachKeyOnce: reads of one hot key, and reads sharing
// their extra keys (tagged values and their versions), put each key in the
// batch's MGET once, and every read still gets its own value and replies.
func TestABatchReadsEachKeyOnce(t *testing.T) {
	gate, rdb, p, cl := newGatedClient(t)
	for _, k := range []string{"hot", "a", "v1", "v2"} {
		require.NoError(t, rdb.Set(t.Context(), p+k, "x"+k, 0).Err())
	}
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = cl.Get(t.Context(), p+"lead") })
	gate.Next(t)
	for range 3 {
		wg.Go(func() {
			b, err := cl.Get(t.Context(), p+"hot")
			assert.NoError(t, err)
			assert.Equal(t, "xhot", string(b))
		})
	}
	wg.Go(func() {
		b, vals, err := cl.GetWith(t.Context(), p+"a", []string{p + "v1", p + "v2"})
		assert.NoError(t, err)
		assert.Equal(t, "xa", string(b))
		assert.Equal(t, []any{"xv1", "xv2"}, vals)
	})
	wg.Go(func() {
		b, vals, err := cl.GetWith(t.Context(), p+"none", []string{p + "v2", p + "hot", p + "v1"})
		assert.ErrorIs(t, err, redis.Nil)
		assert.Nil(t, b)
		assert.Equal(t, []any{"xv2", "xhot", "xv1"}, vals)
	})
	queued(t, cl, 5)
	gate.Release()
	assert.ElementsMatch(t, []string{p + "hot", p + "a", p + "v1", p + "v2", p + "none"}, gate.Next(t), "each key once")
	gate.Open()
	wg.Wait()
}

// TestReaderLeavesWhenItsCtxEndsDuringABatch: two reads in one MGET; the
// first one's ctx ends while the MGET's reply is held: it returns at once,
// the other still gets its value from the same MGET.
func TestReaderLeavesWhenItsCtxEndsDuringABatch(t *testing.T) {
	gate, rdb, p, cl := newGatedClient(t)
	k1, k2 := p+"k1", p+"k2"
	require.NoError(t, rdb.Set(t.Context(), k1, "v1", 0).Err())
	require.NoError(t, rdb.Set(t.Context(), k2, "v2", 0).Err())

	var wg sync.WaitGroup
	wg.Go(func() { _, _ = cl.Get(t.Context(), p+"lead") })
	gate.Next(t)
	ctx1, cancel1 := context.WithCancel(t.Context())
	left := make(chan error, 1)
	wg.Go(func() {
		_, err := cl.Get(ctx1, k1)
		left <- err
	})
	var v2 []byte
	var err2 error
	wg.Go(func() { v2, err2 = cl.Get(t.Context(), k2) })
	queued(t, cl, 2)
	gate.Release()
	assert.ElementsMatch(t, []string{k1, k2}, gate.Next(t))
	cancel1()
	select {
	case err := <-left:
		assert.True(t, errors.Is(err, context.Canceled), "Get = %v; want context.Canceled", err)
	case <-time.After(5 * time.Second):
		t.Fatal("a reader whose ctx ended waited for the batch")
	}
	gate.Open()
	wg.Wait()
	require.NoError(t, err2, "the other reader of the batch")
	assert.Equal(t, "v2", string(v2))
	assert.Equal(t, 1, gate.Count("mget"))
}

// TestReadReplies: a value, no value and a value of another type read
// alone (a GET) and in a batch (an MGET) give the same replies.
func TestReadReplies(t *testing.T) {
	gate, rdb, p, cl := newGatedClient(t)
	value, missing, hash := p+"value", p+"missing", p+"hash"
	require.NoError(t, rdb.Set(t.Context(), value, "v", 0).Err())
	require.NoError(t, rdb.HSet(t.Context(), hash, "f", "v").Err())
	tests := []struct {
		key     string
		want    string
		wantErr error
	}{
		{value, "v", nil},
		{missing, "", redis.Nil},
		{hash, "", redis.Nil},
	}
	check := func(how string, got [][]byte, errs []error) {
		for i, tt := range tests {
			assert.ErrorIs(t, errs[i], tt.wantErr, "%s: Get(%q)", how, tt.key)
			assert.Equal(t, tt.want, string(got[i]), "%s: Get(%q)", how, tt.key)
		}
	}

	// Alone first: once a batch went, its sender stays busy for a moment
	// after its readers have their replies, and a read then joins a batch.
	got, errs := make([][]byte, len(tests)), make([]error, len(tests))
	gate.Hold(false)
	for i, tt := range tests {
		got[i], errs[i] = cl.Get(t.Context(), tt.key)
	}
	check("alone", got, errs)
	require.Zero(t, gate.Count("mget"), "lone reads are GETs")

	gate.Hold(true)
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = cl.Get(t.Context(), p+"lead") })
	gate.Next(t)
	for i, tt := range tests {
		wg.Go(func() { got[i], errs[i] = cl.Get(t.Context(), tt.key) })
	}
	queued(t, cl, len(tests))
	gate.Open()
	wg.Wait()
	check("in a batch", got, errs)
	assert.Equal(t, 1, gate.Count("mget"))
}
