package proctest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	RunChild(map[string]Mode{
		// echo says "ready NAME", then "got LINE" for every line it reads.
		"echo": func(env func(string) string) int {
			fmt.Println("ready", env("NAME"))
			in := bufio.NewScanner(os.Stdin)
			for in.Scan() {
				fmt.Println("got", in.Text())
			}
			return 0
		},
		"exit3": func(func(string) string) int { return 3 },
	})
	os.Exit(m.Run())
}

func TestChildTakesOrdersAndReports(t *testing.T) {
	c := Start(t, "echo", map[string]string{"NAME": "a b"})
	if got := c.Expect(t, "ready", 30*time.Second); got != "a b" {
		t.Errorf("Expect(ready) = %q; want the NAME order, %q", got, "a b")
	}
	c.Send(t, "one")
	c.Send(t, "two")
	for _, want := range []string{"one", "two"} {
		if got := c.Expect(t, "got", 30*time.Second); got != want {
			t.Errorf("Expect(got) = %q; want %q", got, want)
		}
	}
}

func TestChildExitCode(t *testing.T) {
	for mode, want := range map[string]int{"exit3": 3, "no such mode": 2} {
		err := Start(t, mode, nil).Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != want {
			t.Errorf("mode %q: Wait() = %v; want exit status %d", mode, err, want)
		}
	}
}

func TestFrozenChildIsKilledAtCleanup(t *testing.T) {
	var c *Child
	t.Run("freeze", func(t *testing.T) {
		c = Start(t, "echo", nil)
		c.Expect(t, "ready", 30*time.Second)
		if err := c.Process().Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	})
	// The subtest's cleanup woke and killed the child, and waited for it.
	if c.cmd.ProcessState == nil {
		t.Fatal("the child was not waited for when its test ended")
	}
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Errorf("child ended with %v; want killed", c.cmd.ProcessState)
	}
}
