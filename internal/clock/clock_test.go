package clock

import (
	"context"
	"testing"
	"time"
)

func TestNowAndAtAgree(t *testing.T) {
	before := Now()
	at := At(time.Now())
	after := Now()
	if at < before || at > after {
		t.Fatalf("At(time.Now()) = %d, not within [%d, %d]", at, before, after)
	}
}

type key struct{}

func TestSharedDeadline(t *testing.T) {
	var d Shared
	now := time.Now()
	a := d.Within(context.Background(), time.Second, now)
	if b := d.Within(context.Background(), time.Second, now.Add(100*time.Millisecond)); b != a {
		t.Error("a flight within the quarter got a new context")
	}
	dl, ok := a.Deadline()
	if !ok || dl.Sub(now) > time.Second+50*time.Millisecond {
		t.Errorf("deadline %v, %v; want within a second of the start", dl, ok)
	}
	if c := d.Within(context.Background(), time.Second, now.Add(300*time.Millisecond)); c == a {
		t.Error("a flight past the quarter got the old context")
	}

	parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	cancel()
	got := d.Within(parent, time.Second, time.Now())
	if got.Value(key{}) != "v" {
		t.Error("the caller's values are lost")
	}
	if got.Err() != nil {
		t.Error("the caller's cancellation reached the shared deadline")
	}
}
