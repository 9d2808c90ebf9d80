//go:build unix

package benchmarks

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user + system) this process has used,
// and true. The private redis-server is another process and not counted.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
