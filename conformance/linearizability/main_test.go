package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runOn writes lines as a history file and runs the checker on it.
func runOn(t *testing.T, lines ...string) (int, string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "history.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{path}, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func get(client int, key string, out, call, ret int64) string {
	return fmt.Sprintf(`{"client":%d,"op":"get","key":%q,"output":%d,"call":%d,"return":%d}`,
		client, key, out, call, ret)
}

func put(client int, key string, in, call, ret int64) string {
	return fmt.Sprintf(`{"client":%d,"op":"put","key":%q,"input":%d,"output":0,"call":%d,"return":%d}`,
		client, key, in, call, ret)
}

func rmw(client int, key string, out, call, ret int64) string {
	return fmt.Sprintf(`{"client":%d,"op":"rmw","key":%q,"input":0,"output":%d,"call":%d,"return":%d}`,
		client, key, out, call, ret)
}

func TestLinearizablePasses(t *testing.T) {
	code, out, errs := runOn(t,
		// k0: overlapping increments, in either order
		rmw(0, "k0", 0, 100, 400),
		rmw(1, "k0", 1, 150, 300), // returned first, took effect second
		get(2, "k0", 2, 500, 600),
		put(0, "k0", 1000, 700, 900),
		get(1, "k0", 2, 750, 800), // overlaps the put: may precede it
		get(2, "k0", 1000, 950, 1000),
		rmw(1, "k0", 1000, 1100, 1200),
		// k1: independent of k0
		get(3, "k1", 0, 100, 200),
		put(3, "k1", 7, 300, 400),
		rmw(2, "k1", 7, 1300, 1400),
	)
	if code != 0 {
		t.Fatalf("exit %d, want 0; stdout %q stderr %q", code, out, errs)
	}
	want := "linearizable: 10 operations, 2 keys, 4 clients\n"
	if out != want {
		t.Errorf("stdout %q, want %q", out, want)
	}
}

func TestStaleReadFails(t *testing.T) {
	code, out, _ := runOn(t,
		put(0, "k0", 5, 100e3, 200e3),
		get(1, "k0", 5, 300e3, 400e3),
		put(0, "k0", 6, 500e3, 600e3),
		get(1, "k0", 5, 700e3, 800e3), // the put of 6 returned before
		get(2, "k1", 0, 100e3, 200e3),
	)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stdout %q", code, out)
	}
	for _, want := range []string{
		"key k0 is not linearizable: 3 of 4 operations linearize, leaving 6,",
		"  after client 0 put k0 6 [t=0.400..0.500 ms]\n",
		"client 1 get k0 -> 5 [t=0.600..0.700 ms]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "k1") {
		t.Errorf("k1 is linearizable but reported:\n%s", out)
	}
}

func TestLostIncrementFails(t *testing.T) {
	// two increments one after the other both saw 3: one update was lost
	code, out, _ := runOn(t,
		put(0, "k2", 3, 0, 100),
		rmw(1, "k2", 3, 200, 300),
		rmw(2, "k2", 3, 400, 500),
		get(0, "k2", 4, 600, 700),
	)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stdout %q", code, out)
	}
	if !strings.Contains(out, "key k2 is not linearizable: 2 of 4 operations linearize, leaving 4,") ||
		!strings.Contains(out, "client 2 rmw k2 -> 3") {
		t.Errorf("unexpected explanation:\n%s", out)
	}
}

func TestOverlappingLostIncrementFails(t *testing.T) {
	// overlap does not excuse it either: two increments from 0 leave 2
	code, out, _ := runOn(t,
		rmw(1, "k0", 0, 100, 500),
		rmw(2, "k0", 0, 200, 400),
		get(0, "k0", 1, 600, 700),
	)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stdout %q", code, out)
	}
}

func TestOtherFailingKeysNamed(t *testing.T) {
	code, out, _ := runOn(t,
		get(0, "k0", 1, 0, 10),
		get(0, "k1", 0, 20, 30),
		get(0, "k2", 2, 40, 50),
		get(0, "k3", 3, 60, 70),
	)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stdout %q", code, out)
	}
	if !strings.HasPrefix(out, "key k0 is not linearizable: 0 of 1 operations") ||
		!strings.HasSuffix(out, "(not linearizable either: k2, k3)\n") {
		t.Errorf("unexpected explanation:\n%s", out)
	}
}

func TestListIsBounded(t *testing.T) {
	// many overlapping reads of a value never written
	lines := []string{put(0, "k0", 5, 0, 10)}
	for i := 1; i <= 30; i++ {
		lines = append(lines, get(i, "k0", 7, 100+int64(i), 9000))
	}
	code, out, _ := runOn(t, lines...)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stdout %q", code, out)
	}
	if n := strings.Count(out, "\n  client"); n != maxListed {
		t.Errorf("%d operations listed, want %d:\n%s", n, maxListed, out)
	}
	if !strings.Contains(out, "  ...\n") {
		t.Errorf("no ellipsis for the rest:\n%s", out)
	}
}

func TestMalformedInputErrors(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{`{"client":0,"op":"get","key":"k0","output":0,"call":1`, "line 1"},
		{`not json`, "line 1"},
		{`{"client":0,"op":"cas","key":"k0","output":0,"call":1,"return":2}`, "not get, put or rmw"},
		{`{"client":0,"op":"put","key":"k0","call":1,"return":2}`, "put without \"input\""},
		{`{"client":0,"op":"rmw","key":"k0","input":0,"call":1,"return":2}`, "rmw without \"output\""},
		{`{"client":0,"op":"get","output":0,"call":1,"return":2}`, "missing \"key\""},
		{`{"op":"get","key":"k0","output":0,"call":1,"return":2}`, "\"client\""},
		{`{"client":0,"op":"get","key":"k0","output":0,"call":1}`, "\"return\""},
		{`{"client":0,"op":"get","key":"k0","output":0,"call":5,"return":2}`, "returns before its call"},
		{`{"client":0,"op":"get","key":"k0","output":0,"call":1,"return":2,"x":1}`, "unknown field"},
		{`{"client":0,"op":"get","key":"k0","output":"0","call":1,"return":2}`, "line 1"},
		{``, "no operations"},
	} {
		code, out, errs := runOn(t, tc.line)
		if code != 2 || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%s: exit %d stdout %q stderr %q; want exit 2 and %q",
				tc.line, code, out, errs, tc.want)
		}
	}
	// the line number points at the bad line
	code, _, errs := runOn(t, get(0, "k0", 0, 1, 2), `{}`)
	if code != 2 || !strings.Contains(errs, "line 2:") {
		t.Errorf("exit %d stderr %q; want exit 2 naming line 2", code, errs)
	}
}

func TestUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(nil, &stdout, &stderr); code != 2 {
		t.Errorf("no arguments: exit %d, want 2", code)
	}
	if code := run([]string{filepath.Join(t.TempDir(), "absent")}, &stdout, &stderr); code != 2 {
		t.Errorf("missing file: exit %d, want 2", code)
	}
}
