package redistest

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
)

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		out     string
		want    Version
		sharded bool
	}{
		{"Redis server v=6.2.16 sha=00000000:0 malloc=libc bits=64 build=c7845fe2ef406f86\n", Version{"Redis", 6, 2, 16}, false},
		{"Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c971a948f0\n", Version{"Redis", 7, 0, 15}, true},
		{"Valkey server v=8.0.1 sha=00000000:0 malloc=libc bits=64 build=1\n", Version{"Valkey", 8, 0, 1}, true},
	} {
		got, err := parseVersion(tc.out)
		if err != nil || got != tc.want {
			t.Errorf("parseVersion(%q) = %v, %v; want %v, nil", tc.out, got, err, tc.want)
		}
		if got.ShardedPubSub() != tc.sharded {
			t.Errorf("%v.ShardedPubSub() = %v; want %v", got, got.ShardedPubSub(), tc.sharded)
		}
	}
	if _, err := parseVersion("redis-server: command not found"); err == nil {
		t.Error("parseVersion of a line without a version: nil error")
	}
}

// TestClusterNodeBusPort starts a cluster node the way every Redis version
// can (no --cluster-port): its bus listens on BusPort.
func TestClusterNodeBusPort(t *testing.T) {
	s := PrivateServer(t, "the test starts a cluster node", "--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf")
	v, err := ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if err := Client(t, s.Addr).Do(context.Background(), "CLUSTER", "MYID").Err(); err != nil {
		t.Fatalf("CLUSTER MYID on %v: %v", v, err)
	}
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.BusPort())))
	if err != nil {
		t.Fatalf("cluster bus of %v at port %d: %v", v, s.BusPort(), err)
	}
	c.Close()
	if !clusterNode([]string{"--cluster-enabled", "yes"}) || clusterNode([]string{"--cluster-enabled", "yes", "--cluster-port", "1"}) ||
		clusterNode(strings.Fields("--cluster-enabled no")) {
		t.Error("clusterNode: wrong on the three argument lists")
	}
}
