// Package catalog is the README's Quick start, verbatim: CI checks that the two
// are the same and compiles this one.
package catalog

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/cache"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
)

type Product struct {
	ID    string `bson:"_id"`
	Name  string `bson:"name"`
	Price int    `bson:"price"`
}

var products = cache.New[Product](
	redis.NewClient(&redis.Options{
		Addr: "localhost:6379",
		// Calls end at the cache's deadlines: a hung Redis costs a call
		// 100ms, not seconds, and FailOpen serves from MongoDB meanwhile.
		ContextTimeoutEnabled: true,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
	}),
	cache.WithPrefix("product:"), // product 42 is cached at "product:42"
	cache.WithTTL(10*time.Minute),
)

// GetProduct reads through the cache: when the key is cold, one caller
// across all instances queries MongoDB and the others wait for its result.
func GetProduct(ctx context.Context, coll *mongo.Collection, id string) (Product, error) {
	return products.GetOrLoad(ctx, id, func(ctx context.Context) (Product, error) {
		var p Product
		err := coll.FindOne(ctx, bson.M{"_id": id}).Decode(&p)
		if errors.Is(err, mongo.ErrNoDocuments) {
			return p, cache.ErrNotFound // cached too, for the not-found TTL
		}
		return p, err
	})
}

// GetFlashSaleProduct is GetProduct for a product on sale: per-call
// options change one call, here a short TTL while its stock moves fast.
func GetFlashSaleProduct(ctx context.Context, coll *mongo.Collection, id string) (Product, error) {
	return products.GetOrLoad(ctx, id, func(ctx context.Context) (Product, error) {
		var p Product
		return p, coll.FindOne(ctx, bson.M{"_id": id}).Decode(&p)
	}, cache.TTL(5*time.Second))
}

// SetPrice writes to MongoDB, then deletes the cached copy: the next read
// loads the new price, even if a load of the old one is still running.
func SetPrice(ctx context.Context, coll *mongo.Collection, id string, price int) error {
	if _, err := coll.UpdateByID(ctx, id, bson.M{"$set": bson.M{"price": price}}); err != nil {
		return err
	}
	return products.Delete(ctx, id)
}
