// Package proctest runs parts of a test in real OS processes: the test
// binary re-executes itself in a child mode, takes its orders from the
// environment and stdin, and reports on stdout, one line per event. A
// package's TestMain calls [RunChild] first; its tests call [Start].
package proctest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// modeEnv names the child mode of a re-executed test binary. legacyModeEnv
// is the name reliability's children read before this package: a child is
// given both, so that reliability/upgrade-check.sh can run one version's
// test with another version's children.
const (
	modeEnv       = "STAMPEDE_TEST_CHILD"
	legacyModeEnv = "STAMPEDE_RELIABILITY_CHILD"
)

// envPrefix is put before the names of a child's orders, so that they
// cannot clash with the variables it inherits.
const envPrefix = "CHILD_"

// Mode is a child program. env returns the orders the parent gave [Start]
// (env("KEY") for the "KEY" entry, "" if none); it returns the exit code.
type Mode func(env func(string) string) int

// RunChild runs the mode this process was started in, if it is a child,
// and exits with its code (2 for a mode not in modes); in the parent it
// returns at once. Call it first in TestMain.
func RunChild(modes map[string]Mode) {
	mode := os.Getenv(modeEnv)
	if mode == "" {
		mode = os.Getenv(legacyModeEnv)
	}
	if mode == "" {
		return
	}
	run, ok := modes[mode]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown child mode %q\n", mode)
		os.Exit(2)
	}
	os.Exit(run(func(k string) string { return os.Getenv(envPrefix + k) }))
}

// Child is a running child process of the test binary.
type Child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // the child's stdout, closed when it ends
}

// Start starts the test binary in mode with env as its orders; the child
// is killed when the test ends (woken first, should the test have frozen
// it).
func Start(tb testing.TB, mode string, env map[string]string) *Child {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), modeEnv+"="+mode, legacyModeEnv+"="+mode)
	for k, v := range env {
		cmd.Env = append(cmd.Env, envPrefix+k+"="+v)
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start child: %v", err)
	}
	c := &Child{cmd: cmd, stdin: stdin, lines: make(chan string, 64)}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			c.lines <- s.Text()
		}
		close(c.lines)
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // a frozen child cannot die
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

// Process is the child's process, for a test that kills or freezes it.
func (c *Child) Process() *os.Process { return c.cmd.Process }

// Wait waits for the child to exit; its error says how it did if not with 0.
func (c *Child) Wait() error { return c.cmd.Wait() }

// Send writes one line to the child's stdin.
func (c *Child) Send(tb testing.TB, line string) {
	tb.Helper()
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		tb.Fatalf("write to child: %v", err)
	}
}

// Expect waits up to within for the child's next line, checks that it
// starts with word and returns the rest, trimmed.
func (c *Child) Expect(tb testing.TB, word string, within time.Duration) string {
	tb.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			tb.Fatalf("child exited while the test waited for %q", word)
		}
		if !strings.HasPrefix(line, word) {
			tb.Fatalf("child said %q; want %q", line, word)
		}
		return strings.TrimSpace(strings.TrimPrefix(line, word))
	case <-time.After(within):
		tb.Fatalf("child did not say %q within %v", word, within)
	}
	return ""
}
