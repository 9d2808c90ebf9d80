// This file runs Lua scripts, many calls in one pipelined round, by hash
// with a fallback for a server that does not have the script yet.

package redisio

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// ScriptCall is one run of a script: its keys, all in one slot, and its
// arguments.
type ScriptCall struct {
	Keys []string
	Args []any
}

// ScriptRun is the calls of one script in a round.
type ScriptRun struct {
	Script *redis.Script
	Src    string // the script's source, for EVAL
	Calls  []ScriptCall
}

// evalCall is one command of an EvalMany round: a call and its script.
type evalCall struct {
	run  *ScriptRun
	call ScriptCall
}

// EvalMany runs script (whose source is src) once per call, and the calls
// of more scripts after them, in one Pipeline round, with EVALSHA. Calls
// that find their script missing (NOSCRIPT) are sent again once after
// SCRIPT LOAD (on every master of a cluster), and with EVAL if still
// missing: a redis.Ring loads scripts on one shard only, and a load that
// failed leaves them missing. It returns the commands in order.
func (cl *Client) EvalMany(ctx context.Context, script *redis.Script, src string, calls []ScriptCall, more ...ScriptRun) []*redis.Cmd {
	runs := append([]ScriptRun{{script, src, calls}}, more...)
	var evals []evalCall
	for i := range runs {
		for _, call := range runs[i].Calls {
			evals = append(evals, evalCall{&runs[i], call})
		}
	}
	cmds := make([]*redis.Cmd, len(evals))
	if len(evals) == 0 {
		return cmds
	}
	all := make([]int, len(evals))
	for i := range all {
		all[i] = i
	}
	cl.sendEvals(ctx, evals, cmds, all, false)
	again, missing := noScript(evals, cmds)
	if len(again) == 0 {
		return cmds
	}
	for run := range missing {
		_ = run.Script.Load(ctx, cl.rdb) // its calls go again whatever it returns: a failed load shows as NOSCRIPT
	}
	cl.sendEvals(ctx, evals, cmds, again, false)
	if again, _ = noScript(evals, cmds); len(again) > 0 {
		cl.sendEvals(ctx, evals, cmds, again, true)
	}
	return cmds
}

// sendEvals sends evals[idx] in one Pipeline round, with EVAL if eval, else
// EVALSHA, each into a new cmds[i].
func (cl *Client) sendEvals(ctx context.Context, evals []evalCall, cmds []*redis.Cmd, idx []int, eval bool) {
	keys, sent := make([]string, len(idx)), make([]redis.Cmder, len(idx))
	for j, i := range idx {
		e := evals[i]
		args := []any{"evalsha", e.run.Script.Hash(), len(e.call.Keys)}
		if eval {
			args[0], args[1] = "eval", e.run.Src
		}
		for _, k := range e.call.Keys {
			args = append(args, k)
		}
		cmds[i] = redis.NewCmd(ctx, append(args, e.call.Args...)...)
		keys[j], sent[j] = e.call.Keys[0], cmds[i]
	}
	cl.Pipeline(ctx, keys, sent)
}

// noScript returns the indexes of the commands that found their script
// missing, and those scripts.
func noScript(evals []evalCall, cmds []*redis.Cmd) (idx []int, missing map[*ScriptRun]bool) {
	missing = map[*ScriptRun]bool{}
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			idx = append(idx, i)
			missing[evals[i].run] = true
		}
	}
	return idx, missing
}
