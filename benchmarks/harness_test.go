// This file is the machinery the benchmarks share: the private Redis,
// the value type and its loader, Redis command counting and latency
// percentiles.
package benchmarks

import (
	"bufio"
	"context"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if private.srv != nil {
		private.srv.Stop()
	}
	redistest.Stop()
	os.Exit(code)
}

// private is the one redis-server all benchmarks share. It is ours alone, so
// INFO commandstats deltas are the competitors' commands and nothing else's,
// and it can be configured (keyspace notifications) without disturbing
// anyone.
var private struct {
	once sync.Once
	srv  *redistest.Server
	err  error
}

// privateRedis starts the benchmarks' redis-server on first use and returns
// its address.
func privateRedis(tb testing.TB) string {
	tb.Helper()
	private.once.Do(func() {
		// Keyspace notifications for expired keys ("Kx") let BenchmarkExpiry
		// count real expiries instead of guessing them from the clock.
		private.srv, private.err = redistest.StartServer("--notify-keyspace-events", "Kx")
	})
	if private.err != nil {
		tb.Fatalf("benchmarks need a redis-server binary of their own (INFO commandstats): %v", private.err)
	}
	return private.srv.Addr
}

// Product is the cached value: a small, realistic record with a string
// slice and a time, so codecs do some real work.
type Product struct {
	ID         int64     `json:"id" msgpack:"id"`
	SKU        string    `json:"sku" msgpack:"sku"`
	Name       string    `json:"name" msgpack:"name"`
	PriceCents int64     `json:"price_cents" msgpack:"price_cents"`
	Currency   string    `json:"currency" msgpack:"currency"`
	Stock      int       `json:"stock" msgpack:"stock"`
	Tags       []string  `json:"tags" msgpack:"tags"`
	UpdatedAt  time.Time `json:"updated_at" msgpack:"updated_at"`
}

// product is what the source of truth holds for id.
func product(id int64) Product {
	return Product{
		ID:         id,
		SKU:        "SKU-" + strconv.FormatInt(100000+id, 10),
		Name:       "Stainless steel water bottle, 750 ml, model " + strconv.FormatInt(id, 10),
		PriceCents: 1999 + id%500,
		Currency:   "EUR",
		Stock:      int(id % 97),
		Tags:       []string{"outdoor", "kitchen", "bpa-free"},
		UpdatedAt:  time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC),
	}
}

// sameProduct reports whether got is want after a round trip through a
// codec (times compare by instant, not by location).
func sameProduct(got, want Product) bool {
	return got.ID == want.ID && got.SKU == want.SKU && got.Name == want.Name &&
		got.PriceCents == want.PriceCents && got.Currency == want.Currency &&
		got.Stock == want.Stock && slices.Equal(got.Tags, want.Tags) &&
		got.UpdatedAt.Equal(want.UpdatedAt)
}

// loadFunc is the loader every competitor is given.
type loadFunc func(ctx context.Context) (Product, error)

// loader returns a loader of id that takes delay, like a database query,
// and counts its completed calls in n. Counting on completion lets
// BenchmarkExpiry attribute a load to the expiry that caused it.
func loader(id int64, delay time.Duration, n *atomic.Int64) loadFunc {
	return func(ctx context.Context) (Product, error) {
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return Product{}, ctx.Err()
			}
		}
		n.Add(1)
		return product(id), nil
	}
}

// cmdStats is a snapshot of INFO commandstats.
type cmdStats struct {
	all     int64 // every command, including those run inside Lua scripts
	scripts int64 // EVAL/EVALSHA and friends: one round trip each
}

// commandStats reads INFO commandstats. Redis counts the commands a Lua
// script runs as well as the script, so all is the work Redis did, not the
// number of round trips; scripts lets the reader tell them apart. INFO and
// CONFIG are the harness's own and left out.
func commandStats(tb testing.TB, admin *redis.Client) cmdStats {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	txt, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	var s cmdStats
	sc := bufio.NewScanner(strings.NewReader(txt))
	for sc.Scan() {
		// cmdstat_get:calls=12,usec=...
		name, rest, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			continue
		}
		switch {
		case name == "info", strings.HasPrefix(name, "config"):
			continue
		case strings.HasPrefix(name, "eval"), strings.HasPrefix(name, "fcall"):
			s.scripts += n
		}
		s.all += n
	}
	return s
}

// percentile returns the q-quantile (0 < q <= 1) of sorted, in milliseconds.
func percentile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = min(max(i, 0), len(sorted)-1)
	return float64(sorted[i]) / float64(time.Millisecond)
}

// reportLatency sorts lat and reports its p50 and p99 on b.
func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(percentile(lat, 0.50), "p50-ms")
	b.ReportMetric(percentile(lat, 0.99), "p99-ms")
}

// reportTail reports the tail beyond p99 of sorted lat: under steady
// traffic the reads that wait for a reload are a small fraction of all
// reads, often under 1%, so p99 alone can hide them.
func reportTail(b *testing.B, lat []time.Duration) {
	b.ReportMetric(percentile(lat, 0.999), "p99.9-ms")
	b.ReportMetric(percentile(lat, 1), "max-ms")
}

// nonce makes key names unique to one run of one benchmark body, since the
// testing package runs a body several times with growing b.N.
var nonceSeq atomic.Int64

func nonce() string {
	return strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatInt(nonceSeq.Add(1), 10)
}

// runShapes runs fn for every competitor and load shape as the
// sub-benchmarks <competitor>/inst=I/g=G, the names results are compared by.
func runShapes(b *testing.B, instances, goroutines []int, fn func(b *testing.B, c competitor, inst, g int)) {
	for _, c := range loaders() {
		b.Run(c.name, func(b *testing.B) {
			for _, inst := range instances {
				b.Run("inst="+strconv.Itoa(inst), func(b *testing.B) {
					for _, g := range goroutines {
						b.Run("g="+strconv.Itoa(g), func(b *testing.B) { fn(b, c, inst, g) })
					}
				})
			}
		})
	}
}
