// Command trackmodes measures what Redis spends per write on client-side
// caching invalidations in broadcast (BCAST) mode against default mode (a
// per-key tracking table), with and without strict coherence's marker and
// acknowledgement round, for N holder clients (the
// figures and the decision are in docs/PROTOCOL.md and
// results/trackmodes-*.txt). It is the protocol alone, on raw go-redis
// connections, not the library: each holder has its own connections, so
// Redis sees N clients, as from N processes.
//
//	cd benchmarks && go run ./trackmodes -reps 4 -out /tmp/trackmodes.txt
//
// Each run starts a private redis-server (PATH) on a free loopback port
// with --save "" --appendonly no, and stops it at the end of the run.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	prefix     = "p:"
	markPrefix = "p:{x}:stampede:mark:" // under prefix "p:", as the library's marker keys are
	markChan   = "p:stampede:near:mark" // shared marker channel (default mode, publish markers)
	invChan    = "__redis__:invalidate"
	writerID   = "w"
)

func ackChan(w string) string { return prefix + "stampede:near:ack:" + w }

const markScript = `redis.call('SET', KEYS[1], '1'); redis.call('DEL', KEYS[1]); return 1`

type variant struct {
	name   string
	mode   string // none | bcast | default
	strict bool   // markers + acks
	marker string // script | publish (strict only)
	hold   string // other | written
}

var variants = map[string]variant{
	"A":    {"A", "none", true, "script", "other"},
	"B1":   {"B1", "bcast", true, "script", "other"},
	"B2":   {"B2", "bcast", true, "script", "written"},
	"C1s":  {"C1s", "default", true, "script", "other"},
	"C2s":  {"C2s", "default", true, "script", "written"},
	"C1p":  {"C1p", "default", true, "publish", "other"},
	"C2p":  {"C2p", "default", true, "publish", "written"},
	"DB1":  {"DB1", "bcast", false, "", "other"},
	"DB2":  {"DB2", "bcast", false, "", "written"},
	"DC1":  {"DC1", "default", false, "", "other"},
	"DC2":  {"DC2", "default", false, "", "written"},
	"none": {"none", "none", false, "", "other"}, // eventual baseline: plain SET, nobody tracking
}

// ---------------------------------------------------------------- server

type server struct {
	cmd  *exec.Cmd
	addr string
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	p := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return p
}

var pinCPU string

func startServer() *server {
	port := freePort()
	args := []string{"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"}
	if pinCPU != "" { // pin redis to its own core, away from the harness
		args = append([]string{"taskset", "-c", pinCPU}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM} // never outlive the harness
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	s := &server{cmd: cmd, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	c := redis.NewClient(&redis.Options{Addr: s.addr, Protocol: 2, DisableIdentity: true})
	defer c.Close()
	for i := 0; i < 200; i++ {
		if c.Ping(context.Background()).Err() == nil {
			return s
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.stop()
	panic("redis-server did not start")
}

func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

// ---------------------------------------------------------------- clients

func newClient(addr string, pool int, onConnect func(context.Context, *redis.Conn) error) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr, Protocol: 2, PoolSize: pool, MinIdleConns: 0, DisableIdentity: true,
		OnConnect: onConnect, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		ContextTimeoutEnabled: false,
	})
}

func do(ctx context.Context, cn *redis.Conn, args ...any) error {
	cmd := redis.NewCmd(ctx, args...)
	return cn.Process(ctx, cmd)
}

type holder struct {
	idx     int
	v       variant
	sub     *redis.Client
	ps      *redis.PubSub
	reader  *redis.Client
	subID   atomic.Int64
	keys    []string
	held    map[string]bool
	msgs    atomic.Int64 // pubsub messages received
	keysInv atomic.Int64 // invalidated (non-marker) keys seen
	marks   atomic.Int64
	rereads atomic.Int64
	errs    atomic.Int64
}

func newHolder(ctx context.Context, addr string, v variant, idx int) *holder {
	h := &holder{idx: idx, v: v, held: map[string]bool{}}
	h.sub = newClient(addr, 1, func(ctx context.Context, cn *redis.Conn) error {
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			return err
		}
		h.subID.Store(id)
		switch {
		case v.mode == "bcast":
			return do(ctx, cn, "CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", prefix)
		case v.mode == "default" && v.strict && v.marker == "script":
			// markers only, in BCAST mode, on this same subscriber
			return do(ctx, cn, "CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", markPrefix)
		}
		return nil
	})
	chans := []string{invChan}
	if v.mode == "default" && v.strict && v.marker == "publish" {
		chans = append(chans, markChan)
	}
	h.ps = h.sub.Subscribe(ctx, chans...)
	for range chans {
		if _, err := h.ps.Receive(ctx); err != nil {
			panic(err)
		}
	}
	h.reader = newClient(addr, 1, func(ctx context.Context, cn *redis.Conn) error {
		if v.mode == "default" {
			return do(ctx, cn, "CLIENT", "TRACKING", "ON", "REDIRECT", h.subID.Load())
		}
		return nil
	})
	for j := 0; j < 10; j++ {
		var k string
		if v.hold == "written" {
			k = fmt.Sprintf("%sk%d", prefix, j)
		} else {
			k = fmt.Sprintf("%sh%d:k%d", prefix, idx, j)
		}
		h.keys = append(h.keys, k)
		if err := h.reader.Get(ctx, k).Err(); err != nil && err != redis.Nil {
			panic(err)
		}
		h.held[k] = true
	}
	return h
}

func (h *holder) run(ctx context.Context) {
	me := fmt.Sprintf("h%d", h.idx)
	for {
		m, err := h.ps.ReceiveMessage(ctx)
		if err != nil {
			return
		}
		h.msgs.Add(1)
		var acks []string // "<writer>:<n>"
		var reread []string
		switch m.Channel {
		case invChan:
			for _, k := range m.PayloadSlice {
				if strings.HasPrefix(k, markPrefix) {
					h.marks.Add(1)
					acks = append(acks, k[len(markPrefix):])
				} else {
					h.keysInv.Add(1)
					if h.held[k] {
						reread = append(reread, k)
					}
				}
			}
		case markChan:
			h.marks.Add(1)
			acks = append(acks, m.Payload)
		}
		if h.v.strict && h.v.mode != "none" {
			for _, a := range acks {
				i := strings.LastIndexByte(a, ':')
				w, n := a[:i], a[i+1:]
				if err := h.reader.Publish(ctx, ackChan(w), me+":"+n).Err(); err != nil {
					h.errs.Add(1)
				}
			}
		}
		// the holder drops the entry and re-reads it (after acking: off the writer's path)
		for _, k := range reread {
			if err := h.reader.Get(ctx, k).Err(); err != nil && err != redis.Nil {
				h.errs.Add(1)
			}
			h.rereads.Add(1)
		}
	}
}

func (h *holder) close() {
	_ = h.ps.Close()
	_ = h.sub.Close()
	_ = h.reader.Close()
}

// ---------------------------------------------------------------- writer

type ackWaiter struct {
	mu      sync.Mutex
	need    int
	pending map[int]*pend
}

type pend struct {
	got  int
	done chan struct{}
}

func (a *ackWaiter) register(n int) chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := &pend{done: make(chan struct{})}
	if a.need == 0 {
		close(p.done)
	}
	a.pending[n] = p
	return p.done
}

func (a *ackWaiter) ack(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pending[n]
	if p == nil {
		return
	}
	p.got++
	if p.got == a.need {
		close(p.done)
		delete(a.pending, n)
	}
}

// ---------------------------------------------------------------- stats

func info(ctx context.Context, c *redis.Client, section string) map[string]string {
	s, err := c.Info(ctx, section).Result()
	if err != nil {
		panic(err)
	}
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(l, ':'); i > 0 && !strings.HasPrefix(l, "#") {
			m[l[:i]] = l[i+1:]
		}
	}
	return m
}

func cpu(ctx context.Context, c *redis.Client) float64 {
	m := info(ctx, c, "cpu")
	s, _ := strconv.ParseFloat(m["used_cpu_sys"], 64)
	u, _ := strconv.ParseFloat(m["used_cpu_user"], 64)
	return s + u
}

// cmdstats returns calls per command, without info/config (the harness's own).
func cmdstats(ctx context.Context, c *redis.Client) (map[string]int64, int64) {
	m := info(ctx, c, "commandstats")
	out := map[string]int64{}
	var total int64
	for k, v := range m {
		if !strings.HasPrefix(k, "cmdstat_") {
			continue
		}
		name := strings.TrimPrefix(k, "cmdstat_")
		if name == "info" || name == "config|resetstat" || name == "config" {
			continue
		}
		for _, f := range strings.Split(v, ",") {
			if strings.HasPrefix(f, "calls=") {
				n, _ := strconv.ParseInt(f[6:], 10, 64)
				out[name] = n
				total += n
			}
		}
	}
	return out, total
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p*float64(len(s))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

// ---------------------------------------------------------------- one run

type result struct {
	v               variant
	n, writers, rep int
	writes          int
	cpuUS, callsPW  float64
	cpuWritesOnlyUS float64
	p50, p99        time.Duration
	window          time.Duration
	timeouts        int64
	msgsPerHolderPW float64
	keysPerMsg      float64
	rereadsPW       float64
	cmd             map[string]int64
	holderErrs      int64
}

func runOnce(v variant, n, writers, writes, rep int) result {
	ctx := context.Background()
	srv := startServer()
	defer srv.stop()
	ctl := newClient(srv.addr, 1, nil)
	defer ctl.Close()

	// values for every key anyone reads or writes
	for j := 0; j < 10; j++ {
		ctl.Set(ctx, fmt.Sprintf("%sk%d", prefix, j), "v", 0)
		ctl.Set(ctx, fmt.Sprintf("%sw:k%d", prefix, j), "v", 0)
	}
	sha, err := ctl.ScriptLoad(ctx, markScript).Result()
	if err != nil {
		panic(err)
	}

	holders := make([]*holder, n)
	for i := range holders {
		holders[i] = newHolder(ctx, srv.addr, v, i)
	}
	hctx, hcancel := context.WithCancel(ctx)
	var hwg sync.WaitGroup
	for _, h := range holders {
		hwg.Add(1)
		go func(h *holder) { defer hwg.Done(); h.run(hctx) }(h)
	}

	need := 0
	if v.strict && v.mode != "none" {
		need = n
	}
	aw := &ackWaiter{need: need, pending: map[int]*pend{}}
	wsub := newClient(srv.addr, 1, nil)
	wps := wsub.Subscribe(ctx, ackChan(writerID))
	if _, err := wps.Receive(ctx); err != nil {
		panic(err)
	}
	go func() {
		for {
			m, err := wps.ReceiveMessage(hctx)
			if err != nil {
				return
			}
			i := strings.LastIndexByte(m.Payload, ':')
			k, _ := strconv.Atoi(m.Payload[i+1:])
			aw.ack(k)
		}
	}()
	wcli := newClient(srv.addr, writers, nil)
	for i := 0; i < writers; i++ { // warm the pool
		wcli.Ping(ctx)
	}

	time.Sleep(200 * time.Millisecond) // let setup settle
	if err := ctl.ConfigResetStat(ctx).Err(); err != nil {
		panic(err)
	}
	cpu0 := cpu(ctx, ctl)
	t0 := time.Now()

	var next atomic.Int64
	var timeouts atomic.Int64
	lat := make([][]time.Duration, writers)
	var wwg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wwg.Add(1)
		go func(w int) {
			defer wwg.Done()
			for {
				k := int(next.Add(1)) - 1
				if k >= writes {
					return
				}
				var key string
				if v.hold == "written" {
					key = fmt.Sprintf("%sk%d", prefix, k%10)
				} else {
					key = fmt.Sprintf("%sw:k%d", prefix, k%10)
				}
				done := aw.register(k)
				start := time.Now()
				pipe := wcli.Pipeline()
				pipe.Set(ctx, key, strconv.Itoa(k), 0)
				if v.strict {
					if v.marker == "publish" {
						pipe.Publish(ctx, markChan, writerID+":"+strconv.Itoa(k))
					} else {
						pipe.EvalSha(ctx, sha, []string{markPrefix + writerID + ":" + strconv.Itoa(k)})
					}
				}
				if _, err := pipe.Exec(ctx); err != nil {
					panic(err)
				}
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					timeouts.Add(1)
				}
				lat[w] = append(lat[w], time.Since(start))
			}
		}(w)
	}
	wwg.Wait()
	tw := time.Since(t0)
	cpuW := cpu(ctx, ctl)

	// drain: wait until the holders are quiet (re-reads done, messages consumed)
	sig := func() int64 {
		var s int64
		for _, h := range holders {
			s += h.msgs.Load()*7 + h.rereads.Load()*13 + h.keysInv.Load()
		}
		return s
	}
	last, stable := sig(), 0
	for stable < 5 {
		time.Sleep(20 * time.Millisecond)
		if s := sig(); s == last {
			stable++
		} else {
			last, stable = s, 0
		}
	}
	cpu1 := cpu(ctx, ctl)
	window := time.Since(t0)
	cs, total := cmdstats(ctx, ctl)

	hcancel()
	_ = wps.Close()
	_ = wsub.Close()
	_ = wcli.Close()
	for _, h := range holders {
		h.close()
	}
	hwg.Wait()

	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	r := result{v: v, n: n, writers: writers, rep: rep, writes: writes,
		cpuUS:           (cpu1 - cpu0) * 1e6 / float64(writes),
		cpuWritesOnlyUS: (cpuW - cpu0) * 1e6 / float64(writes),
		callsPW:         float64(total) / float64(writes),
		p50:             pct(all, 0.50), p99: pct(all, 0.99), window: window, timeouts: timeouts.Load(), cmd: cs}
	_ = tw
	if n > 0 {
		var msgs, keys, rr, errs int64
		for _, h := range holders {
			msgs += h.msgs.Load()
			keys += h.keysInv.Load() + h.marks.Load()
			rr += h.rereads.Load()
			errs += h.holderErrs()
		}
		r.msgsPerHolderPW = float64(msgs) / float64(n) / float64(writes)
		if msgs > 0 {
			r.keysPerMsg = float64(keys) / float64(msgs)
		}
		r.rereadsPW = float64(rr) / float64(writes)
		r.holderErrs = errs
	}
	return r
}

func (h *holder) holderErrs() int64 { return h.errs.Load() }

// ---------------------------------------------------------------- ordering check

// orderCheck: a pipeline [SET key, PUBLISH ch] from a writer; a holder whose
// subscriber hears both __redis__:invalidate and ch. Which arrives first?
// Default mode sends the invalidation while SET executes; BCAST mode queues
// it until beforeSleep, i.e. after every command of the pipeline ran.
func orderCheck(mode string, rounds int) (invFirst, pubFirst int) {
	ctx := context.Background()
	srv := startServer()
	defer srv.stop()
	v := variant{name: "order", mode: mode, hold: "written"}
	var subID atomic.Int64
	sub := newClient(srv.addr, 1, func(ctx context.Context, cn *redis.Conn) error {
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			return err
		}
		subID.Store(id)
		if mode == "bcast" {
			return do(ctx, cn, "CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", prefix)
		}
		return nil
	})
	defer sub.Close()
	ps := sub.Subscribe(ctx, invChan, "ordchan")
	ps.Receive(ctx)
	ps.Receive(ctx)
	reader := newClient(srv.addr, 1, func(ctx context.Context, cn *redis.Conn) error {
		if mode == "default" {
			return do(ctx, cn, "CLIENT", "TRACKING", "ON", "REDIRECT", subID.Load())
		}
		return nil
	})
	defer reader.Close()
	w := newClient(srv.addr, 1, nil)
	defer w.Close()
	_ = v
	for i := 0; i < rounds; i++ {
		key := prefix + "ord"
		reader.Get(ctx, key) // (re)register in default mode
		pipe := w.Pipeline()
		pipe.Set(ctx, key, i, 0)
		pipe.Publish(ctx, "ordchan", i)
		if _, err := pipe.Exec(ctx); err != nil {
			panic(err)
		}
		m, err := ps.ReceiveMessage(ctx)
		if err != nil {
			panic(err)
		}
		if m.Channel == invChan {
			invFirst++
		} else {
			pubFirst++
		}
		m2, err := ps.ReceiveMessage(ctx)
		if err != nil || m2.Channel == m.Channel {
			panic(fmt.Sprint("unexpected ", m2, err))
		}
	}
	return
}

// ---------------------------------------------------------------- main

func main() {
	vs := flag.String("variants", "A,B1,B2,C1s,C2s,C1p,C2p,DB1,DB2,DC1,DC2", "variants")
	ns := flag.String("n", "0,4,16,32", "holder counts")
	reps := flag.Int("reps", 2, "repetitions")
	repbase := flag.Int("repbase", 0, "added to the rep number in the output")
	writes := flag.Int("writes", 2000, "writes per run")
	writers := flag.Int("writers", 1, "concurrent writer goroutines")
	out := flag.String("out", "results.txt", "raw output (appended)")
	order := flag.Bool("order", false, "run the ordering check only")
	idle := flag.Bool("idle", false, "measure idle redis CPU with 33 holders connected")
	flag.StringVar(&pinCPU, "pin", "", "if set, run redis-server under taskset -c <pin>")
	flag.Parse()

	f, err := os.OpenFile(*out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	emit := func(s string) { fmt.Print(s); f.WriteString(s) }

	if *order {
		for _, m := range []string{"default", "bcast"} {
			a, b := orderCheck(m, 200)
			emit(fmt.Sprintf("ORDER mode=%s pipeline[SET k; PUBLISH ch]: invalidation-first=%d publish-first=%d\n", m, a, b))
		}
		return
	}
	if *idle {
		ctx := context.Background()
		srv := startServer()
		ctl := newClient(srv.addr, 1, nil)
		var hs []*holder
		for i := 0; i < 32; i++ {
			hs = append(hs, newHolder(ctx, srv.addr, variants["B2"], i))
		}
		time.Sleep(300 * time.Millisecond)
		c0 := cpu(ctx, ctl)
		time.Sleep(3 * time.Second)
		c1 := cpu(ctx, ctl)
		emit(fmt.Sprintf("IDLE redis cpu with 32 holders (65 conns): %.1f us/s\n", (c1-c0)*1e6/3))
		for _, h := range hs {
			h.close()
		}
		ctl.Close()
		srv.stop()
		return
	}

	var nlist []int
	for _, s := range strings.Split(*ns, ",") {
		x, _ := strconv.Atoi(s)
		nlist = append(nlist, x)
	}
	emit(fmt.Sprintf("# %s writes=%d writers=%d reps=%d redis-pinned-cpu=%q\n", time.Now().Format(time.RFC3339), *writes, *writers, *reps, pinCPU))
	emit("#variant\tN\twriters\trep\tcpu_us/write\tcpu_us/write(writes only)\tcalls/write\tp50_us\tp99_us\twindow_s\ttimeouts\tmsgs/holder/write\tkeys/msg\trereads/write\tholder_errs\tcmds\n")
	for rep := 1; rep <= *reps; rep++ {
		for _, vn := range strings.Split(*vs, ",") {
			v, ok := variants[vn]
			if !ok {
				panic("unknown variant " + vn)
			}
			for _, n := range nlist {
				r := runOnce(v, n, *writers, *writes, rep+*repbase)
				var cmds []string
				for k, c := range r.cmd {
					cmds = append(cmds, fmt.Sprintf("%s=%.2f", k, float64(c)/float64(r.writes)))
				}
				sort.Strings(cmds)
				emit(fmt.Sprintf("%s\t%d\t%d\t%d\t%.2f\t%.2f\t%.2f\t%d\t%d\t%.2f\t%d\t%.3f\t%.2f\t%.2f\t%d\t%s\n",
					v.name, n, r.writers, rep, r.cpuUS, r.cpuWritesOnlyUS, r.callsPW,
					r.p50.Microseconds(), r.p99.Microseconds(), r.window.Seconds(), r.timeouts,
					r.msgsPerHolderPW, r.keysPerMsg, r.rereadsPW, r.holderErrs, strings.Join(cmds, " ")))
			}
		}
	}
}
