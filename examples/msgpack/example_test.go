package msgpack_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/examples/msgpack"
	"github.com/stampede-go/stampede/internal/redistest"
)

func TestMain(m *testing.M) {
	if err := redistest.Export(); err != nil { // the example reads REDIS_ADDR
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	redistest.Stop()
	os.Exit(code)
}

type Product struct {
	ID      string    `msgpack:"id"`
	Name    string    `msgpack:"name"`
	Price   int       `msgpack:"price"`
	Updated time.Time `msgpack:"updated"`
}

func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()

	products := cache.New[Product](rdb,
		cache.WithPrefix("example:msgpack:product:"),
		cache.WithCodec(msgpack.Codec{}),
	)
	defer products.Close() // ends its background work (subscriptions, refreshes)
	defer products.Delete(ctx, "42")

	load := func(context.Context) (Product, error) {
		return Product{ID: "42", Name: "Espresso machine", Price: 19900,
			Updated: time.Date(2026, 11, 1, 9, 0, 0, 0, time.UTC)}, nil
	}
	if _, err := products.GetOrLoad(ctx, "42", load); err != nil { // loads and stores
		fmt.Println("error:", err)
		return
	}
	p, err := products.GetOrLoad(ctx, "42", load) // decoded from Redis
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println(p.Name, p.Price, p.Updated.Format(time.DateOnly))
	// Output: Espresso machine 19900 2026-11-01
}

func TestRoundTrip(t *testing.T) {
	in := Product{ID: "1", Name: "ü", Price: -3, Updated: time.Unix(1700000000, 5).UTC()}
	b, err := msgpack.Codec{}.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out Product
	if err := (msgpack.Codec{}).Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !out.Updated.Equal(in.Updated) || out.ID != in.ID || out.Name != in.Name || out.Price != in.Price {
		t.Errorf("round trip of %+v = %+v", in, out)
	}
}
