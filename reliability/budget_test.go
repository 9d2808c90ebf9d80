// This file checks the waiter's budget against the holder's: with the default options a waiter in another process keeps
// waiting while the holder legitimately loads, up to the load timeout; when a
// budget does run out, the error says which key and what budget.
package reliability_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stampede-go/stampede/cache"
	"github.com/stampede-go/stampede/internal/redistest"
)

// TestDefaultBudgetCoversALongLoad loads for 7s (longer than the old 6s
// waiter budget, within the 30s load timeout) in one process while another
// process asks for the same key, both with the default options.
func TestDefaultBudgetCoversALongLoad(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	key := redistest.Prefix(t, newClient(t, addr, nil)) + "slow"
	holder, waiter := procs(t, 1, addr, nil)[0], procs(t, 1, addr, nil)[0]
	const loadFor = 7 * time.Second
	src := newSource(loadFor)
	src.entered = make(chan string, 1)
	held := make(chan error, 1)
	go func() {
		_, err := holder.GetOrLoad(context.Background(), key, src.loader(key, "v"))
		held <- err
	}()
	<-src.entered
	start := time.Now()
	v, err := waiter.GetOrLoad(context.Background(), key, src.loader(key, "waiter's"))
	waited := time.Since(start)
	if err != nil || v != "v" {
		t.Errorf("waiter: GetOrLoad = %q, %v after %v; want the holder's %q", v, err, waited.Round(time.Millisecond), "v")
	}
	if err := <-held; err != nil {
		t.Errorf("holder: %v", err)
	}
	if n := src.loads(key); n != 1 {
		t.Errorf("loads = %d; want 1", n)
	}
	t.Logf("figures: default options, load %v: waiter in another process got %q, err=%v after %v; loads=%d",
		loadFor, v, err, waited.Round(time.Millisecond), src.loads(key))
}

// TestBudgetErrorNamesKeyAndBudget spends a small budget while a holder
// loads: the waiter's error must match ErrLockNotAcquired and say which key
// and which budget, so that an operator knows what to tune.
func TestBudgetErrorNamesKeyAndBudget(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	key := redistest.Prefix(t, newClient(t, addr, nil)) + "budget"
	holder := procs(t, 1, addr, nil)[0]
	waiter := procs(t, 1, addr, nil, cache.WithRetry(3, 20*time.Millisecond))[0]
	src := newSource(0)
	src.entered = make(chan string, 1)
	src.hold = make(chan struct{}) // the holder loads until the waiter gave up, however slow the machine
	held := make(chan error, 1)
	go func() {
		_, err := holder.GetOrLoad(context.Background(), key, src.loader(key, "v"))
		held <- err
	}()
	<-src.entered
	_, err := waiter.GetOrLoad(context.Background(), key, src.loader(key, "waiter's"))
	close(src.hold)
	if !errors.Is(err, cache.ErrLockNotAcquired) {
		t.Fatalf("waiter: GetOrLoad = %v; want ErrLockNotAcquired", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, key) {
		t.Errorf("error %q does not name the key %q", msg, key)
	}
	if !strings.Contains(msg, "3") || !strings.Contains(msg, "20ms") {
		t.Errorf("error %q does not name the budget (3 retries, 20ms apart)", msg)
	}
	if err := <-held; err != nil {
		t.Errorf("holder: %v", err)
	}
	if n := src.loads(key); n != 1 {
		t.Errorf("loads = %d; want 1 (the waiter gave up, it did not load)", n)
	}
	t.Logf("figures: WithRetry(3, 20ms) against a load that outlasts it: %v", err)
}

// TestLoadTimeoutEndsAWaitWithKeyAndTimeout: with the default budget the
// wait ends at about the load timeout; the error says why, with the key.
func TestLoadTimeoutEndsAWaitWithKeyAndTimeout(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	key := redistest.Prefix(t, newClient(t, addr, nil)) + "timeout"
	holder := procs(t, 1, addr, nil)[0]
	waiter := procs(t, 1, addr, nil, cache.WithLoadTimeout(500*time.Millisecond))[0]
	src := newSource(0)
	src.entered = make(chan string, 1)
	src.hold = make(chan struct{}) // the holder loads until the waiter gave up, however slow the machine
	held := make(chan error, 1)
	go func() {
		_, err := holder.GetOrLoad(context.Background(), key, src.loader(key, "v"))
		held <- err
	}()
	<-src.entered
	_, err := waiter.GetOrLoad(context.Background(), key, src.loader(key, "waiter's"))
	close(src.hold)
	if !errors.Is(err, cache.ErrLockNotAcquired) {
		t.Fatalf("waiter: GetOrLoad = %v; want ErrLockNotAcquired", err)
	}
	// The default budget is as many retries as fit in the load timeout:
	// whichever ends first, the error names the key and what ended the wait.
	if msg := err.Error(); !strings.Contains(msg, key) || !strings.Contains(msg, "500ms") && !strings.Contains(msg, "5 retries 100ms apart") {
		t.Errorf("error %q does not name the key %q and the load timeout (500ms) or the budget it gives (5 retries 100ms apart)", msg, key)
	}
	if err := <-held; err != nil {
		t.Errorf("holder: %v", err)
	}
	if n := src.loads(key); n != 1 {
		t.Errorf("loads = %d; want 1", n)
	}
	t.Logf("figures: default budget, WithLoadTimeout(500ms) against a load that outlasts it: %v", err)
}
