// This file records the events of the standalone lock (package lock) as
// the lock.* metrics, with the instruments and attribute sets built once.

package cacheotel

import (
	"context"
	"errors"

	"github.com/stampede-go/stampede/lock"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The attribute keys of the lock's metrics.
const (
	KeyLockName    = attribute.Key("lock.name")       // the name given to LockObserver
	KeyLockOutcome = attribute.Key("lock.outcome")    // obtained | not_obtained | error
	KeyLockLostAt  = attribute.Key("lock.lost.found") // held | release
)

// LockObserver returns a function for [lock.WithObserver] that records the
// lock's events as the lock.* metrics listed in the package documentation,
// each data point with lock.name = name (the job the locks are for, such
// as "customer-sync": never the key). Give it to every Obtain, ObtainQuorum
// or Do of that job.
//
// The MeterProvider is [go.opentelemetry.io/otel.GetMeterProvider] unless [WithMeterProvider]
// says otherwise; [WithAttributes] adds attributes to every data point. It
// returns an error if name is empty or an instrument cannot be created; the
// observer it returns with such an error still works, recording what it
// can. The returned function is safe for concurrent use.
func LockObserver(name string, opts ...Option) (func(lock.Event), error) {
	in, base := start(opts, KeyLockName, "lock", name)
	o := &lockObserver{
		wait: in.histogram("lock.wait.duration",
			"Duration of the calls that took a lock or gave up (Obtain, ObtainQuorum, Do), waits for another holder included, by outcome."),
		attempts: in.counter("lock.attempts", "{attempt}", "Attempts to take a lock made by those calls, retries included, by outcome."),
		losses: in.counter("lock.losses", "{loss}",
			"Locks found lost, once per acquisition, by where: while held (a renewal, TTL, or Hold's lease running out) or at Release."),
		refusals: in.counter("lock.fence.refusals", "{write}",
			"Writes that a store refused because a later holder's fence had written (reported by the application with Lock.FenceRefused)."),
	}
	o.label(base)
	return o.observe, in.err()
}

// label builds, once, the attribute sets of every measurement: base (the
// name and WithAttributes's; the package's own last, so that they win) and
// each measurement's own.
func (o *lockObserver) label(base []attribute.KeyValue) {
	set := func(extra ...attribute.KeyValue) attribute.Set {
		return attribute.NewSet(append(append([]attribute.KeyValue(nil), base...), extra...)...)
	}
	for i, n := range lockOutcomeNames {
		s := set(KeyLockOutcome.String(n))
		o.outcome[i] = []metric.RecordOption{metric.WithAttributeSet(s)}
		o.outcomeAdd[i] = []metric.AddOption{metric.WithAttributeSet(s)}
	}
	o.lostHeld = []metric.AddOption{metric.WithAttributeSet(set(KeyLockLostAt.String("held")))}
	o.lostAtRelease = []metric.AddOption{metric.WithAttributeSet(set(KeyLockLostAt.String("release")))}
	o.plain = []metric.AddOption{metric.WithAttributeSet(set())}
}

// The values of KeyLockOutcome, as indexes of lockObserver.outcome.
const (
	lockObtained = iota
	lockNotObtained
	lockError
	numberOfLockOutcomes
)

var lockOutcomeNames = [numberOfLockOutcomes]string{lockObtained: "obtained", lockNotObtained: "not_obtained", lockError: "error"}

// lockObserver holds the lock's instruments and, for each measurement, its
// options with the attribute set built once. Read-only after LockObserver,
// so safe for concurrent use.
type lockObserver struct {
	wait                           metric.Float64Histogram
	attempts, losses, refusals     metric.Int64Counter
	outcome                        [numberOfLockOutcomes][]metric.RecordOption
	outcomeAdd                     [numberOfLockOutcomes][]metric.AddOption
	lostHeld, lostAtRelease, plain []metric.AddOption
}

// observe records one event; kinds it does not know are ignored.
func (o *lockObserver) observe(e lock.Event) {
	ctx := context.Background() // events carry no context: no exemplar links to a span
	switch e.Kind {
	case lock.EventObtained, lock.EventNotObtained:
		i := lockOutcomeOf(e)
		o.wait.Record(ctx, e.Duration.Seconds(), o.outcome[i]...)
		o.attempts.Add(ctx, int64(e.Attempts), o.outcomeAdd[i]...)
	case lock.EventLost:
		o.losses.Add(ctx, 1, o.lostHeld...)
	case lock.EventLostAtRelease:
		o.losses.Add(ctx, 1, o.lostAtRelease...)
	case lock.EventFenceRefused:
		o.refusals.Add(ctx, 1, o.plain...)
	}
}

func lockOutcomeOf(e lock.Event) int {
	switch {
	case e.Kind == lock.EventObtained:
		return lockObtained
	case errors.Is(e.Err, lock.ErrNotObtained):
		return lockNotObtained
	default:
		return lockError
	}
}
