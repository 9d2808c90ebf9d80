package redistest

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

func TestAddrAnswers(t *testing.T) {
	rdb := Client(t, Addr(t))
	p := Prefix(t, rdb)
	if err := rdb.Set(context.Background(), p+"k", "v", 0).Err(); err != nil {
		t.Fatalf("SET on the test Redis: %v", err)
	}
	if got, err := rdb.Get(context.Background(), p+"k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want %q, nil", got, err, "v")
	}
}

func TestDeletePrefixRemovesLockKeys(t *testing.T) {
	rdb := Client(t, Addr(t))
	p := "stampedetest:delprefix:[x]*?:"
	ctx := context.Background()
	// The value, its lock as cache.LockKey names it (under the key, or, for a
	// key with a stray '{', before it), and the older lock shape.
	mine := []string{p + "a", p + "a{5716}:stampede:lock", "{5716}:stampede:lock" + p + "a{b}", "{" + p + "a}:lock"}
	others := []string{"stampedetest:delprefix:other", "{5716}:stampede:lockstampedetest:delprefix:other{}"}
	for _, k := range append(mine, others...) {
		rdb.Set(ctx, k, 1, 0)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), others...) })
	DeletePrefix(rdb, p)
	if n := rdb.Exists(ctx, mine...).Val(); n != 0 {
		t.Errorf("%d of %q left after DeletePrefix; want 0", n, mine)
	}
	if n := rdb.Exists(ctx, others...).Val(); n != int64(len(others)) {
		t.Errorf("DeletePrefix(%q) deleted keys outside the prefix: %d of %q left; want all", p, n, others)
	}
}

func TestPrivateServer(t *testing.T) {
	s := PrivateServer(t, "this test checks PrivateServer")
	if s.Addr == Addr(t) {
		t.Fatalf("PrivateServer shares the test Redis at %s", s.Addr)
	}
	if err := Client(t, s.Addr).Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING the private server: %v", err)
	}
}

// TestContainerUsesTheDockerCLI runs container() against a fake docker CLI
// that answers like a real one and publishes the shared test Redis, since
// CI has no Docker engine.
func TestContainerUsesTheDockerCLI(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the fake docker CLI is a shell script")
	}
	addr := Addr(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	script := `#!/bin/sh
echo "$*" >>` + log + `
case "$1" in
info) exit 0 ;;
run) echo c0ffee ;;
port) echo ` + addr + `; echo "[::1]:1" ;;
rm) exit 0 ;;
*) exit 1 ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "docker"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))

	got, stop, err := container()
	if err != nil {
		t.Fatalf("container() = %v", err)
	}
	if got != addr {
		t.Errorf("container() address = %q; want %q, the first line of docker port", got, addr)
	}
	stop()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	calls := strings.Split(strings.TrimSpace(string(b)), "\n")
	want := []string{"info", "run -d --rm ", "port c0ffee 6379/tcp", "rm -f c0ffee"}
	if len(calls) != len(want) {
		t.Fatalf("docker calls:\n%s\nwant %d: %q", b, len(want), want)
	}
	for i, w := range want {
		if !strings.HasPrefix(calls[i], w) {
			t.Errorf("docker call %d = %q; want it to start with %q", i, calls[i], w)
		}
	}
	if !strings.Contains(calls[1], "-p 127.0.0.1::6379 "+image) {
		t.Errorf("docker run %q does not publish 6379 on a loopback port only", calls[1])
	}
}

func TestContainerWithoutEngine(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the fake docker CLI is a shell script")
	}
	dir := t.TempDir()
	script := "#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(dir, "docker"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	if _, _, err := container(); err == nil || !strings.Contains(err.Error(), "docker info") {
		t.Fatalf("container() without an engine = %v; want an error from docker info", err)
	}
}
