// This file finds or starts the Redis and MongoDB the demo runs against,
// seeds the product catalogue, and reads the servers' own counters of the
// work done (database finds, Redis commands).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stampede-go/stampede/internal/redistest"
	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

// Product is one catalogue entry, as stored in MongoDB and cached in Redis.
type Product struct {
	// SKU is the _id: FerretDB's SQLite backend finds string and ObjectID
	// _ids by index but scans the collection for numbers.
	SKU   string  `bson:"_id" json:"sku"`
	Name  string  `bson:"name" json:"name"`
	Price float64 `bson:"price" json:"price"`
	Stock int     `bson:"stock" json:"stock"`
}

// hotN is the number of the product of the flash sale; hotID its _id.
const hotN = 4242

var hotID = sku(hotN)

func sku(n int) string { return fmt.Sprintf("SKU-%06d", n) }

// errNoProduct is a load that found no hot product: the seeding failed, a
// request error rather than a cacheable "not found".
var errNoProduct = errors.New("hot product missing from the catalogue")

// env is the servers of one run and the admin clients the parent uses to
// seed, count and clean up. Workers never use these clients.
type env struct {
	runID     string // keeps this run's keys and database apart from others
	redisAddr string
	redisDesc string
	miniredis bool // no INFO commandstats: Redis commands are counted by client hooks
	mongoURI  string
	mongoDesc string
	dbName    string
	rdb       *redis.Client
	mdb       *mongo.Client
	closers   []func() // run in reverse order by close
}

func hotKey(runID, strategy string) string {
	return hotPrefix(runID, strategy) + "product:" + hotID
}

// hotPrefix is the start of a strategy's keys (stampede-near's cache prefix).
func hotPrefix(runID, strategy string) string {
	return "stampede-hotkey:" + runID + ":" + strategy + ":"
}

func setup(ctx context.Context, cfg config, logw io.Writer) (e *env, err error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	e = &env{runID: hex.EncodeToString(b[:])}
	e.dbName = "stampede_hotkey_" + e.runID
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if err := e.startRedis(ctx, cfg.RedisAddr); err != nil {
		return nil, err
	}
	if err := e.startMongo(ctx, cfg, logw); err != nil {
		return nil, err
	}
	return e, e.seed(ctx, cfg.Products)
}

// startRedis uses the Redis at addr, else a private redis-server from PATH
// (the near cache needs its client-side caching), else an embedded
// miniredis, on which stampede-near cannot serve from memory.
func (e *env) startRedis(ctx context.Context, addr string) error {
	e.redisDesc = "REDIS_ADDR " + addr
	if addr == "" {
		if s, err := redistest.StartServer(); err == nil {
			e.closers = append(e.closers, s.Stop)
			addr = s.Addr
			e.redisDesc = "redis-server from PATH at " + addr + " (set REDIS_ADDR to use another Redis)"
		}
	}
	if addr == "" {
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return fmt.Errorf("start miniredis: %w", err)
		}
		// miniredis only expires keys when told to; ClockTTL makes TTLs run
		// on the wall clock like a real Redis, which is the point of the demo.
		m.ClockTTL(true)
		e.closers = append(e.closers, m.Close)
		addr, e.miniredis = m.Addr(), true
		e.redisDesc = "embedded miniredis at " + addr + " (no redis-server on PATH; install one or set REDIS_ADDR to see stampede-near)"
	}
	e.redisAddr = addr
	e.rdb = redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	e.closers = append(e.closers, func() {
		e.deleteKeys()
		_ = e.rdb.Close()
	})
	if err := e.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", addr, err)
	}
	return nil
}

func (e *env) startMongo(ctx context.Context, cfg config, logw io.Writer) error {
	uri := cfg.MongoURI
	e.mongoDesc = "MONGO_URI " + redactURI(uri)
	if uri == "" {
		dir, err := os.MkdirTemp("", "stampede-hotkey-")
		if err != nil {
			return err
		}
		e.closers = append(e.closers, func() { _ = os.RemoveAll(dir) })
		logger := slog.New(slog.DiscardHandler) // quiet unless -v
		if cfg.Verbose {
			logger = slog.New(slog.NewTextHandler(logw, nil)).With("server", "ferretdb")
		}
		f, err := ferretdb.New(&ferretdb.Config{
			Listener:  ferretdb.ListenerConfig{TCP: "127.0.0.1:0"},
			Logger:    logger,
			Handler:   "sqlite",
			SQLiteURL: "file:" + dir + "/",
		})
		if err != nil {
			return fmt.Errorf("start FerretDB: %w", err)
		}
		fctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() { _ = f.Run(fctx); close(done) }()
		// Registered before the client's disconnect, so it runs after it:
		// FerretDB stops once no connection is left to cut.
		e.closers = append(e.closers, func() { stop(); <-done })
		uri = f.MongoDBURI()
		e.mongoDesc = "embedded FerretDB v1.24.0 (SQLite in " + dir + ") at " + uri + " (set MONGO_URI to use a real one)"
	}
	e.mongoURI = uri
	mdb, err := mongo.Connect(ctx, options.Client().ApplyURI(uri))
	if err != nil {
		return fmt.Errorf("mongodb at %s: %w", redactURI(uri), err)
	}
	e.mdb = mdb
	e.closers = append(e.closers, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = mdb.Database(e.dbName).Drop(cctx)
		_ = mdb.Disconnect(cctx)
	})
	return mdb.Ping(ctx, nil)
}

// seed writes the catalogue; the hot product is one of many, as in a real
// collection.
func (e *env) seed(ctx context.Context, n int) error {
	coll := e.mdb.Database(e.dbName).Collection("products")
	const batch = 1000
	docs := make([]any, 0, batch)
	for i := 1; i <= max(n, hotN); i++ {
		docs = append(docs, Product{SKU: sku(i), Name: fmt.Sprintf("Product %d", i), Price: float64(i%500) + 0.99, Stock: i % 100})
		if len(docs) == batch || i == max(n, hotN) {
			if _, err := coll.InsertMany(ctx, docs); err != nil {
				return fmt.Errorf("seed products: %w", err)
			}
			docs = docs[:0]
		}
	}
	return nil
}

func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
	e.closers = nil
}

// deleteKeys removes this run's values and lock keys, so a shared Redis is
// left as it was found.
func (e *env) deleteKeys() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, pattern := range []string{"stampede-hotkey:" + e.runID + ":*", "{stampede-hotkey:" + e.runID + ":*"} {
		iter := e.rdb.Scan(ctx, 0, pattern, 100).Iterator()
		for iter.Next(ctx) {
			e.rdb.Del(ctx, iter.Val())
		}
	}
}

// finds returns the server's count of find commands (serverStatus
// metrics.commands.find.total: MongoDB and FerretDB both keep it), or -1 when
// the server does not report it.
func (e *env) finds(ctx context.Context) int64 {
	var st struct {
		Metrics struct {
			Commands map[string]struct {
				Total int64 `bson:"total"`
			} `bson:"commands"`
		} `bson:"metrics"`
	}
	err := e.mdb.Database("admin").RunCommand(ctx, bson.D{{Key: "serverStatus", Value: 1}}).Decode(&st)
	if err != nil || st.Metrics.Commands == nil {
		return -1
	}
	return st.Metrics.Commands["find"].Total
}

// redisCommands returns the commands the Redis server has executed, from
// INFO commandstats, or -1 when the server does not report them (miniredis).
// INFO itself, connection handshakes (HELLO, CLIENT SETINFO) and PING are
// left out: they are the measurement, the pools warming up and the
// instances' start-up check, not the workload.
// Commands run inside Lua scripts are counted, as Redis counts them.
func (e *env) redisCommands(ctx context.Context) int64 {
	if e.miniredis {
		return -1
	}
	s, err := e.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return -1
	}
	var total int64
	found := false
	for line := range strings.Lines(s) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		found = true
		switch strings.TrimPrefix(name, "cmdstat_") {
		case "info", "hello", "client|setinfo", "ping":
			continue
		}
		for kv := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				total += n
			}
		}
	}
	if !found {
		return -1
	}
	return total
}

// redactURI hides a password in a MongoDB URI before it is printed.
func redactURI(uri string) string {
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return uri
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 && at < strings.IndexAny(rest+"/", "/") {
		return scheme + "://***@" + rest[at+1:]
	}
	return uri
}
