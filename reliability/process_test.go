// This file runs parts of a test in real OS processes: the test binary
// re-executes itself in a child mode (see TestMain), takes its orders from
// the environment and stdin, and reports on stdout, one line per event.
package reliability_test

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

// childModeEnv names the child mode of a re-executed test binary.
const childModeEnv = "STAMPEDE_RELIABILITY_CHILD"

// childModes are the child programs, by mode; each returns the exit code.
var childModes = map[string]func(env func(string) string) int{
	"reader": runReaderChild, // TestDeleteInAnotherProcess
}

func runChild(mode string) int {
	run, ok := childModes[mode]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown child mode %q\n", mode)
		return 2
	}
	return run(func(k string) string { return os.Getenv("CHILD_" + k) })
}

// child is a running child process of the test binary.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

// startChild starts the test binary in mode with env as CHILD_* variables;
// it is killed when the test ends.
func startChild(t testing.TB, mode string, env map[string]string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childModeEnv+"="+mode)
	for k, v := range env {
		cmd.Env = append(cmd.Env, "CHILD_"+k+"="+v)
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	c := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 64)}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			c.lines <- s.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

// send writes one line to the child's stdin.
func (c *child) send(t testing.TB, line string) {
	t.Helper()
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		t.Fatalf("write to child: %v", err)
	}
}

// expect waits for the child's next line, checks its first word and returns
// the rest.
func (c *child) expect(t testing.TB, word string, within time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			t.Fatalf("child exited while the test waited for %q", word)
		}
		if !strings.HasPrefix(line, word) {
			t.Fatalf("child said %q; want %q", line, word)
		}
		return strings.TrimSpace(strings.TrimPrefix(line, word))
	case <-time.After(within):
		t.Fatalf("child did not say %q within %v", word, within)
	}
	return ""
}
