// This file measures what tags cost a hit:
// BenchmarkHitTags/near=<on|skip|off>/tags=<off|0|3>/keys=<hot|spread10k>:
// near=on hits memory, near=skip reads Redis past a near cache (SkipNear:
// the tag versions come from memory), near=off has no near cache (a hit
// reads the versions from Redis too); tags=off is a Cache without
// WithTags, tags=0 one with it storing untagged values (a read still
// checks for Clear), tags=3 values stored with three tags. Compare with
// benchstat -col /tags.
package benchmarks

import (
	"strconv"
	"testing"
	"time"

	"github.com/stampede-go/stampede/cache"
)

func BenchmarkHitTags(b *testing.B) {
	addr := privateRedis(b)
	for _, near := range []string{"on", "skip", "off"} {
		for _, tags := range []string{"off", "0", "3"} {
			b.Run("near="+near+"/tags="+tags, func(b *testing.B) {
				prefix := "bench:tags:" + near + tags + ":" + nonce() + ":"
				opts := []cache.Option{cache.WithPrefix(prefix)}
				if near != "off" {
					opts = append(opts, cache.WithNearCache(64<<20))
				}
				if tags != "off" {
					opts = append(opts, cache.WithTags())
				}
				in, err := openStampedeWith(addr, time.Hour, opts...)
				if err != nil {
					b.Fatal(err)
				}
				defer in.Close()
				if tags == "3" {
					in.call = []cache.CallOption{cache.Tags("tenant:42", "category:7", "brand:3")}
				}
				if near == "skip" {
					in.call = append(in.call, cache.SkipNear())
				}
				keys := make([]string, hitSpread)
				for i := range keys {
					keys[i] = strconv.Itoa(i)
				}
				warm(b, in, "hot", 0)
				warmAll(b, in, keys)
				b.Run("keys=hot", func(b *testing.B) {
					benchHits(b, in, hitContexts[0].ctx, func(int) (string, int64) { return "hot", 0 })
				})
				b.Run("keys=spread10k", func(b *testing.B) {
					benchHits(b, in, hitContexts[0].ctx, func(i int) (string, int64) {
						i %= hitSpread
						return keys[i], int64(i)
					})
				})
			})
		}
	}
}
