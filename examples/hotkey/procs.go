// This file runs the instances as real OS processes for -procs: the binary
// re-executes itself with the instance spec in an environment variable, and
// each child reports progress and its tally to the parent as JSON lines on
// stdout.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"
)

// childEnv holds the instance spec of a child process; its presence is what
// makes the binary a child (a variable rather than a flag keeps it out of -h).
const childEnv = "STAMPEDE_HOTKEY_CHILD"

// message is one line a child writes: ready, progress (with the loads since
// the last message, from which the parent counts expiries), or its final tally.
type message struct {
	Ready    bool   `json:"ready,omitempty"`
	Requests int64  `json:"requests,omitempty"`
	Loads    int64  `json:"loads,omitempty"`
	Spans    []span `json:"spans,omitempty"`
	Result   *tally `json:"result,omitempty"`
	Error    string `json:"error,omitempty"`
}

// childMain is one instance in its own process: connect, say ready, wait for
// the parent's "go" line on stdin, run until its "stop" line, report.
func childMain(specJSON string) int {
	enc := json.NewEncoder(os.Stdout)
	var mu sync.Mutex // protects enc: progress and the result are written from two goroutines
	send := func(m message) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(m)
	}
	var spec instanceSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		send(message{Error: err.Error()})
		return 1
	}
	ctx := context.Background()
	live := &counters{}
	in, err := newInstance(ctx, spec, live)
	if err != nil {
		send(message{Error: err.Error()})
		return 1
	}
	defer in.close()
	send(message{Ready: true})

	start, stop := make(chan struct{}), make(chan struct{})
	go func() {
		r := bufio.NewReader(os.Stdin)
		_, _ = r.ReadString('\n')
		close(start)
		_, _ = r.ReadString('\n')
		close(stop) // "stop", or a closed stdin: the parent is gone
	}()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		sent := 0 // loads already reported
		for {
			select {
			case <-done:
				return
			case <-t.C:
				spans := live.spansFrom(sent)
				sent += len(spans)
				send(message{Requests: live.requests.Load(), Loads: live.loads.Load(), Spans: spans})
			}
		}
	})
	t := in.run(ctx, start, stop)
	close(done)
	wg.Wait()
	send(message{Result: &t})
	return 0
}

// child is the parent's handle on one child process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

// runProcs starts n children for spec, starts their traffic together once
// all are connected, stops it when w says, and adds up their tallies.
func runProcs(ctx context.Context, n int, spec instanceSpec, live *counters, w *window) (tally, error) {
	exe, err := os.Executable()
	if err != nil {
		return tally{}, err
	}
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return tally{}, err
	}
	children := make([]*child, 0, n)
	defer func() {
		for _, c := range children {
			_ = c.stdin.Close()
			_ = c.cmd.Wait()
		}
	}()
	for range n {
		cmd := exec.CommandContext(ctx, exe)
		cmd.Env = append(os.Environ(), childEnv+"="+string(specJSON))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return tally{}, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return tally{}, err
		}
		if err := cmd.Start(); err != nil {
			return tally{}, err
		}
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 64<<20) // the final tally is one long line
		children = append(children, &child{cmd: cmd, stdin: stdin, lines: sc})
	}
	for _, c := range children {
		m, err := c.next()
		if err != nil {
			return tally{}, err
		}
		if !m.Ready {
			return tally{}, errors.New("child did not report ready")
		}
	}
	for _, c := range children {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			return tally{}, err
		}
	}
	w.open(ctx)
	quit := make(chan struct{})
	var stopper sync.WaitGroup
	stopper.Go(func() {
		select {
		case <-w.stop:
		case <-quit: // a child failed
		}
		for _, c := range children {
			_, _ = io.WriteString(c.stdin, "stop\n")
		}
	})
	defer func() { close(quit); stopper.Wait() }() // runs before the children are closed and waited for

	tallies := make([]tally, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, c := range children {
		wg.Go(func() {
			var reqs, loads int64 // this child's totals so far, to add only the news to live
			for {
				m, err := c.next()
				if err != nil {
					errs[i] = err
					return
				}
				if m.Result != nil {
					tallies[i] = *m.Result
					live.requests.Add(m.Result.Requests - reqs)
					return
				}
				live.requests.Add(m.Requests - reqs)
				live.loads.Add(m.Loads - loads)
				live.addSpans(m.Spans...)
				reqs, loads = m.Requests, m.Loads
			}
		})
	}
	wg.Wait()
	var total tally
	for _, t := range tallies {
		total.merge(t)
	}
	return total, errors.Join(errs...)
}

func (c *child) next() (message, error) {
	var m message
	if !c.lines.Scan() {
		err := c.lines.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return m, fmt.Errorf("child %d: %w", c.cmd.Process.Pid, err)
	}
	if err := json.Unmarshal(c.lines.Bytes(), &m); err != nil {
		return m, fmt.Errorf("child %d: %w", c.cmd.Process.Pid, err)
	}
	if m.Error != "" {
		return m, fmt.Errorf("child %d: %s", c.cmd.Process.Pid, m.Error)
	}
	return m, nil
}
