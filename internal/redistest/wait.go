package redistest

import "time"

// Eventually polls cond every few milliseconds for up to within and reports
// whether it held. Tests give generous bounds: a loaded -race run is slow.
func Eventually(within time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}
