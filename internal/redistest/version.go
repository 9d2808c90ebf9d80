// This file tells which server the redis-server on PATH is, so that tests
// can start it with the options it knows (Redis 6.2 has no sharded pub/sub
// and no --cluster-port).

package redistest

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
)

// Version is the name and version of a redis-server binary.
type Version struct {
	Name                string // "Redis" or "Valkey"
	Major, Minor, Patch int
}

func (v Version) String() string {
	return fmt.Sprintf("%s %d.%d.%d", v.Name, v.Major, v.Minor, v.Patch)
}

// ShardedPubSub reports whether the server knows SSUBSCRIBE and SPUBLISH
// (Redis 7.0, every Valkey).
func (v Version) ShardedPubSub() bool { return v.Name == "Valkey" || v.Major >= 7 }

var serverVersion struct {
	once sync.Once
	v    Version
	err  error
}

// ServerVersion runs `redis-server --version` (once) and parses its
// "Redis server v=6.2.16 ..." or "Valkey server v=8.0.1 ...".
func ServerVersion() (Version, error) {
	serverVersion.once.Do(func() {
		out, err := exec.Command("redis-server", "--version").Output()
		if err != nil {
			serverVersion.err = fmt.Errorf("redistest: redis-server --version: %w", err)
			return
		}
		serverVersion.v, serverVersion.err = parseVersion(string(out))
	})
	return serverVersion.v, serverVersion.err
}

var versionLine = regexp.MustCompile(`^(\w+) server v=(\d+)\.(\d+)\.(\d+)`)

func parseVersion(out string) (Version, error) {
	m := versionLine.FindStringSubmatch(out)
	if m == nil {
		return Version{}, fmt.Errorf("redistest: cannot read the version in %q", out)
	}
	v := Version{Name: m[1]}
	v.Major, _ = strconv.Atoi(m[2])
	v.Minor, _ = strconv.Atoi(m[3])
	v.Patch, _ = strconv.Atoi(m[4])
	return v, nil
}
