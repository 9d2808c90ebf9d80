package leaktest

import (
	"strings"
	"testing"
)

func TestFindReportsALeakAndNotTheRunner(t *testing.T) {
	if err := Find(); err != nil {
		t.Fatalf("Find() with nothing running = %v; want nil", err)
	}
	stop := make(chan struct{})
	go func() { <-stop }()
	leaks := leaked()
	close(stop)
	if len(leaks) != 1 || !strings.Contains(leaks[0], "TestFindReportsALeakAndNotTheRunner") {
		t.Fatalf("leaked() = %q; want the one goroutine this test started", leaks)
	}
	if err := Find(); err != nil {
		t.Fatalf("Find() after the goroutine ended = %v; want nil", err)
	}
}
