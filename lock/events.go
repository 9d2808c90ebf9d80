// This file is what the lock reports for metrics: one Event per
// acquisition, give-up, loss and fence refusal, sent to the functions given
// to WithObserver. The lock depends on no metrics library; the
// OpenTelemetry adapter lives in its own module.

package lock

import (
	"errors"
	"time"
)

// EventKind says what an [Event] reports.
type EventKind uint8

// The events. Duration, Attempts, Fence and Err are set where the kind says
// so.
const (
	// EventObtained: [Obtain], [ObtainQuorum] or [Do] took the lock.
	// Duration: how long the call took, its waits for another holder
	// included; Attempts: how many attempts it made (1 when the lock was
	// free); Fence: the acquisition's fencing token (0 for a quorum lock).
	EventObtained EventKind = iota + 1
	// EventNotObtained: the call returned without the lock. Err: its error,
	// which wraps [ErrNotObtained] when someone else held the lock through
	// every attempt the retry strategy allowed or until ctx ended (Attempts
	// is 0 when ctx had ended before the first), and is a Redis error
	// otherwise. Duration and Attempts as for EventObtained. A call with an
	// invalid argument or option reports nothing: it never reached Redis.
	EventNotObtained
	// EventLost: a lock was found lost while held: a renewal ([Lock.Refresh],
	// [Lock.Hold]'s watchdog) or [Lock.TTL] found that the key no longer
	// holds this holder's token (Err: [ErrNotHeld]), or Hold cancelled its
	// work because the lease ran out before a renewal was answered (Err:
	// [ErrLost]). Reported once per acquisition, by the first call that
	// finds it, and never once [Lock.Release] has been called.
	EventLost
	// EventLostAtRelease: [Lock.Release] found that the key no longer held
	// this holder's token: the lease ran out, or another holder took the
	// key, before the work ended. Err: [ErrNotHeld]. Not reported when the
	// loss was already (EventLost), nor by a Release after the first.
	EventLostAtRelease
	// EventFenceRefused: the application said, through
	// [Lock.FenceRefused], that its store refused a write sent with this
	// lock's fence: a later holder has written. Fence: the refused fence.
	EventFenceRefused
)

var eventNames = [...]string{
	EventObtained: "obtained", EventNotObtained: "not_obtained", EventLost: "lost",
	EventLostAtRelease: "lost_at_release", EventFenceRefused: "fence_refused",
}

// String returns the kind's snake_case name, for metric and log labels.
func (k EventKind) String() string {
	if int(k) < len(eventNames) && eventNames[k] != "" {
		return eventNames[k]
	}
	return "unknown"
}

// Event is one step of a lock's life.
type Event struct {
	Kind     EventKind
	Key      string        // the lock key, prefix included
	Duration time.Duration // EventObtained, EventNotObtained: how long the call took
	Attempts int           // EventObtained, EventNotObtained: the attempts it made
	Fence    int64         // the acquisition's fencing token; 0: none (a quorum lock, no acquisition)
	Err      error
}

// emit sends e to the lock's observers, if any. A panicking observer is
// recovered: events are sent from the lock's own goroutines too (Hold's
// watchdog), where a panic would end the process, and the lock's work goes
// on as if the observer had returned (see WithObserver).
func (l *Lock) emit(e Event) {
	if l.observer == nil {
		return
	}
	defer func() { _ = recover() }()
	l.observer(e)
}

// reportObtain reports the end of an Obtain or ObtainQuorum that made
// attempts attempts since start, err its error.
func (l *Lock) reportObtain(start time.Time, attempts int, err error) {
	if l.observer == nil {
		return
	}
	e := Event{Kind: EventObtained, Key: l.key, Duration: time.Since(start), Attempts: attempts, Err: err}
	if err != nil {
		e.Kind = EventNotObtained
	} else {
		e.Fence = l.fence
	}
	l.emit(e)
}

// lost reports, once per acquisition, that the lock was found lost (kind:
// by whom) when err says so. Losses found while held are not reported once
// Release began: its own deletion would look like one.
func (l *Lock) lost(kind EventKind, err error) {
	if l.observer == nil || (!errors.Is(err, ErrNotHeld) && !errors.Is(err, ErrLost)) {
		return
	}
	if (kind == EventLost && isClosed(l.released)) || l.lossSeen.Swap(true) {
		return
	}
	l.emit(Event{Kind: kind, Key: l.key, Fence: l.fence, Err: err})
}

// FenceRefused tells the lock's observers (see [WithObserver]) that the
// store refused a write sent with this lock's fence ([Lock.Fence]): a later
// holder has written, so this one has lost the lock. The lock cannot see
// the store's check; call FenceRefused where it fails (no row updated) to
// count such refusals ([EventFenceRefused]). It asks no Redis and changes
// nothing else; it does nothing on a nil Lock or one without an observer.
func (l *Lock) FenceRefused() {
	if l == nil {
		return
	}
	l.emit(Event{Kind: EventFenceRefused, Key: l.key, Fence: l.fence})
}
