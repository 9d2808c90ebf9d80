package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The go-redis hooks the tests share: counters and recorders of what a
// client sends, and faults a test injects into it. A hook goes on a client
// with AddHook before the client is in use (go-redis before v9.6 does not
// allow adding one later); on a cluster, on every node client (OnNewNode).

// Named matches the commands named one of names, in lower case as
// [redis.Cmder.Name] gives them ("get", "evalsha").
func Named(names ...string) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool { return slices.Contains(names, cmd.Name()) }
}

// IsScript matches a script call: EVALSHA, or the EVAL that go-redis falls
// back to when the server has not loaded the script yet.
func IsScript(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" || cmd.Name() == "eval" }

// lostReply is the error a hook reports in place of a reply it drops.
func lostReply() error {
	return &net.OpError{Op: "read", Net: "tcp", Err: errors.New("reply lost")}
}

// Commands counts what a client sends, singly or in pipelines: commands by
// name, the bytes of their arguments, and the connections it dials. Match,
// if set, chooses the commands counted. Its zero value counts; safe for
// concurrent use.
type Commands struct {
	Match func(redis.Cmder) bool

	mu    sync.Mutex     // protects n, bytes
	n     map[string]int // by name
	bytes int
	dials atomic.Int64
}

// CountCommands adds a counter of every command to rdb and returns it.
func CountCommands(rdb *redis.Client) *Commands {
	c := &Commands{}
	rdb.AddHook(c)
	return c
}

func (c *Commands) add(cmds ...redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cmd := range cmds {
		if c.Match != nil && !c.Match(cmd) {
			continue
		}
		if c.n == nil {
			c.n = map[string]int{}
		}
		c.n[cmd.Name()]++
		for _, a := range cmd.Args() {
			switch a := a.(type) {
			case string:
				c.bytes += len(a)
			case []byte:
				c.bytes += len(a)
			default:
				c.bytes += len(fmt.Sprint(a))
			}
		}
	}
}

// Count is the number of commands named name sent so far.
func (c *Commands) Count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

// Total is the number of commands sent so far.
func (c *Commands) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.n {
		n += v
	}
	return n
}

// Dials is the number of connections dialled so far.
func (c *Commands) Dials() int64 { return c.dials.Load() }

// Take returns the counts by name and the bytes of the arguments since the
// last Take or Reset, and starts counting again.
func (c *Commands) Take() (n map[string]int, bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, bytes = c.n, c.bytes
	if n == nil {
		n = map[string]int{}
	}
	c.n, c.bytes = nil, 0
	return n, bytes
}

// Reset starts counting again, dials included.
func (c *Commands) Reset() {
	c.Take()
	c.dials.Store(0)
}

func (c *Commands) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.dials.Add(1)
		return next(ctx, network, addr)
	}
}

func (c *Commands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.add(cmd); return next(ctx, cmd) }
}

func (c *Commands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.add(cmds...); return next(ctx, cmds) }
}

// Recorder records the round trips a client makes: one entry per pipeline
// or single command, with the names and the arguments of its commands. Its
// zero value records; safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex // protects rounds, args
	rounds [][]string // the command names of each round
	args   [][]any    // the arguments of every command, in order
}

// RecordRounds adds a recorder to rdb and returns it.
func RecordRounds(rdb *redis.Client) *Recorder {
	r := &Recorder{}
	rdb.AddHook(r)
	return r
}

func (r *Recorder) add(cmds ...redis.Cmder) {
	if len(cmds) == 0 {
		return
	}
	names := make([]string, len(cmds))
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, cmd := range cmds {
		names[i] = cmd.Name()
		r.args = append(r.args, cmd.Args())
	}
	r.rounds = append(r.rounds, names)
}

// Reset forgets what was recorded.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rounds, r.args = nil, nil
}

// Count returns the number of rounds with a command named name and the
// number of such commands in them.
func (r *Recorder) Count(name string) (rounds, cmds int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, round := range r.rounds {
		n := 0
		for _, c := range round {
			if c == name {
				n++
			}
		}
		if n > 0 {
			rounds++
			cmds += n
		}
	}
	return rounds, cmds
}

// Starting is the number of rounds whose first command is named name.
func (r *Recorder) Starting(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, round := range r.rounds {
		if round[0] == name {
			n++
		}
	}
	return n
}

// Total is the number of rounds, not counting the handshakes of new
// connections (HELLO, CLIENT SETINFO).
func (r *Recorder) Total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, round := range r.rounds {
		if round[0] != "hello" && round[0] != "client" {
			n++
		}
	}
	return n
}

// Rounds returns the command names of each round, for messages.
func (r *Recorder) Rounds() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rounds)
}

// Args returns the arguments of every command sent, in order.
func (r *Recorder) Args() [][]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.args)
}

func (r *Recorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *Recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { r.add(cmd); return next(ctx, cmd) }
}

func (r *Recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { r.add(cmds...); return next(ctx, cmds) }
}

// Fail fails commands without sending them, as a migrating slot or a
// misconfigured server would: the first n that match, singly or in a
// pipeline (which then fails whole, unsent). Make it with FailCommands.
type Fail struct {
	match func(redis.Cmder) bool
	err   error
	left  atomic.Int64 // failures still to make
	seen  atomic.Int64
}

// FailCommands returns a hook that fails the first n commands match accepts
// with err.
func FailCommands(match func(redis.Cmder) bool, err error, n int64) *Fail {
	f := &Fail{match: match, err: err}
	f.left.Store(n)
	return f
}

// Seen is the number of commands it failed.
func (f *Fail) Seen() int64 { return f.seen.Load() }

func (f *Fail) fail(cmd redis.Cmder) bool {
	if !f.match(cmd) || f.left.Add(-1) < 0 {
		return false
	}
	f.seen.Add(1)
	cmd.SetErr(f.err)
	return true
}

func (f *Fail) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *Fail) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if f.fail(cmd) {
			return f.err
		}
		return next(ctx, cmd)
	}
}

func (f *Fail) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if f.fail(cmd) {
				return f.err
			}
		}
		return next(ctx, cmds)
	}
}

// LoseReplies returns a hook that sends the first n single commands match
// accepts and, when they succeed, reports a network error in place of their
// reply: the command took effect, the client does not know it.
func LoseReplies(match func(redis.Cmder) bool, n int64) redis.Hook {
	h := &loseReplies{match: match}
	h.left.Store(n)
	return h
}

type loseReplies struct {
	match func(redis.Cmder) bool
	left  atomic.Int64 // replies still to lose
}

func (h *loseReplies) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *loseReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.match(cmd) && err == nil && h.left.Add(-1) >= 0 {
			err = lostReply()
			cmd.SetErr(err)
		}
		return err
	}
}

func (h *loseReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Resend returns a hook that sends every single command match accepts
// twice and keeps the second reply, as go-redis does when the reply to the
// first was lost.
func Resend(match func(redis.Cmder) bool) redis.Hook { return resend{match} }

type resend struct{ match func(redis.Cmder) bool }

func (h resend) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h resend) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd) {
			if err := next(ctx, cmd); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (h resend) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Delay returns a hook that waits d before sending each single command
// match accepts, as a slow network would.
func Delay(match func(redis.Cmder) bool, d time.Duration) redis.Hook { return delay{match, d} }

type delay struct {
	match func(redis.Cmder) bool
	d     time.Duration
}

func (h delay) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h delay) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd) {
			time.Sleep(h.d)
		}
		return next(ctx, cmd)
	}
}

func (h delay) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// ReadGate counts a client's GETs and MGETs and, while on, holds the reply
// of each one sent alone, once the server has answered it, until the test
// lets it go: what the caller does with a read on the wire can then be
// arranged. Make it with NewReadGate; it starts on.
type ReadGate struct {
	on      atomic.Bool
	replied chan []string // the keys of a read the server answered, its reply held
	release chan struct{} // lets one held reply go

	mu        sync.Mutex     // protects reads, pipelines
	reads     map[string]int // by command name, in pipelines too
	pipelines int            // pipelines with a read
}

// NewReadGate returns a gate that is on.
func NewReadGate() *ReadGate {
	g := &ReadGate{replied: make(chan []string, 64), release: make(chan struct{}), reads: map[string]int{}}
	g.on.Store(true)
	return g
}

// Next waits for the next read the server answered, its reply held, and
// returns its keys.
func (g *ReadGate) Next(tb testing.TB) []string {
	tb.Helper()
	select {
	case keys := <-g.replied:
		return keys
	case <-time.After(10 * time.Second):
		tb.Fatal("no read reached the server")
		return nil
	}
}

// Release lets the held reply go.
func (g *ReadGate) Release() { g.release <- struct{}{} }

// Open lets every read through from now on, the held one included.
func (g *ReadGate) Open() {
	g.on.Store(false)
	close(g.release)
}

// Hold turns the gate on or off without releasing a held reply.
func (g *ReadGate) Hold(on bool) { g.on.Store(on) }

// Count is the number of commands named name (get or mget) sent so far,
// in pipelines too.
func (g *ReadGate) Count(name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reads[name]
}

// Pipelines is the number of pipelines with a read sent so far.
func (g *ReadGate) Pipelines() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pipelines
}

func isRead(cmd redis.Cmder) bool { return cmd.Name() == "get" || cmd.Name() == "mget" }

func (g *ReadGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *ReadGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if !isRead(cmd) {
			return err
		}
		g.mu.Lock()
		g.reads[cmd.Name()]++
		g.mu.Unlock()
		if g.on.Load() {
			var keys []string
			for _, a := range cmd.Args()[1:] {
				keys = append(keys, a.(string))
			}
			g.replied <- keys
			<-g.release
		}
		return err
	}
}

func (g *ReadGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.mu.Lock()
		counted := false
		for _, cmd := range cmds {
			if isRead(cmd) {
				g.reads[cmd.Name()]++
				counted = true
			}
		}
		if counted {
			g.pipelines++
		}
		g.mu.Unlock()
		return next(ctx, cmds)
	}
}
