// This file measures a hit against a raw go-redis GET + decode in
// the same run, with a Background and a cancellable context; the
// comparison with other libraries is in the benchmarks module.

package cache

import (
	"context"
	"encoding/json"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/record"
	"github.com/stampede-go/stampede/internal/redistest"
	"github.com/stampede-go/stampede/internal/token"
)

func BenchmarkHitPath(b *testing.B) {
	rdb := redistestClient(b)
	p := "bench:hitpath:" + token.NewToken() + ":"
	c := New[product](rdb, WithoutJitter())
	const n = 1000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = p + strconv.Itoa(i)
		if _, err := c.GetOrLoad(context.Background(), keys[i], (&counter{}).load); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { rdb.Del(context.Background(), keys...) })
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, ctxc := range []struct {
		name string
		ctx  context.Context
	}{{"background", context.Background()}, {"cancellable", cancellable}} {
		ctx := ctxc.ctx
		b.Run("raw/"+ctxc.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				raw, err := rdb.Get(ctx, keys[i%n]).Bytes()
				if err != nil {
					b.Fatal(err)
				}
				var v product
				if err := json.Unmarshal(raw[record.HeaderLen+record.FreshnessLen:], &v); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
		b.Run("raw-parallel/"+ctxc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				i := int(nextSeq.Add(7919))
				for pb.Next() {
					raw, err := rdb.Get(ctx, keys[i%n]).Bytes()
					if err != nil {
						b.Error(err)
						return
					}
					var v product
					if err := json.Unmarshal(raw[record.HeaderLen+record.FreshnessLen:], &v); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
		})
		b.Run("stampede-parallel/"+ctxc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				i := int(nextSeq.Add(7919))
				for pb.Next() {
					if _, err := c.GetOrLoad(ctx, keys[i%n], failLoadProduct); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
		})
		b.Run("stampede/"+ctxc.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := c.GetOrLoad(ctx, keys[i%n], failLoadProduct); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

var nextSeq atomic.Int64

func failLoadProduct(context.Context) (product, error) { panic("a hit benchmark must not load") }

func redistestClient(tb testing.TB) *redis.Client {
	return redistest.Client(tb, redistest.Addr(tb))
}
